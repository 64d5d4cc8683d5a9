"""What the PyTorch and TensorFlow compressors share, and only that: the compressor core both
subclass (:mod:`.compressor`: arguments, configuration, handshake, decisions, scaling, stats),
the public factories (:mod:`.factory`), the slips caught first (:mod:`.guards`), the two
frontends' names (:mod:`.frameworks`), the CPU probe (:mod:`.probe`), the worker pool
(:mod:`.workers`), elastic resets (:mod:`.elastic`) and a rank's place in a process set
(:mod:`.membership`). What decides is :mod:`hvd_gradq.plan`; what runs a
reduction is :mod:`hvd_gradq.reduce`."""
