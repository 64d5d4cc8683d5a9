"""The plan layer: the cost model and everything that decides how a tensor is reduced (the
pattern, its cross-host part, the second phase's scheme, the CPU figures, where ranks sit on hosts).
It sits below the reduction core (:mod:`hvd_gradq.reduce`), which cuts tensors by its layout."""
