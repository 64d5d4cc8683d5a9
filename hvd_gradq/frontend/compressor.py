"""What both frontends' compressors are, without a framework: :class:`CompressorCore`.

PyTorch's and TensorFlow's ``GradqCompressor`` subclass it thinly: each keeps its constructor's
signature and docstring (the factories read both: :mod:`.factory`), its Horovod calls, tensors,
tracing and call-site reading, and hands everything else here, so that the two cannot drift:

* **the arguments** (:meth:`CompressorCore.__init__`): scheme and policy to a
  :class:`~hvd_gradq.spec.Config`, ``seed``, ``pattern``, ``link_gbps``, ``fallback``,
  ``threads``, ``check_ranks``, ``process_set``, each checked with a GradqError that says what to
  write; a pattern the scheme or the frontend cannot serve is refused here, not at the first step;
* **the configuration** every rank must agree on (:meth:`~CompressorCore.config`, one text
  format, :func:`hvd_gradq.reduce.handshake.config_text`) and its :meth:`~CompressorCore.digest`;
* **the handshake** (:meth:`~CompressorCore.handshake`): once a process set, the configuration
  and cluster layout compared across its ranks, and the CPU figures the cost model prices with
  agreed (:mod:`.probe`), with the link rate where nobody gave one (:mod:`.link`), through the
  frontend's allgather;
* **the decision** (:meth:`~CompressorCore.decide`, :func:`hvd_gradq.plan.decide.decide`) and the
  **warm-up** (:meth:`~CompressorCore.warm` at a known step, :meth:`~CompressorCore.warm_note`
  where a graph picks the step at run time);
* **Horovod's final scaling** (:func:`final_scale`) and **the process set** a reduction runs on
  (:meth:`~CompressorCore.reduction_set`);
* **stats()**: the :class:`~.stats.Stats` the frontend's telemetry fills, and the ``world`` it
  reports (:meth:`~CompressorCore.world`); ``stats()`` / ``summary()`` / ``metrics()`` are
  :class:`~.stats.Reports`'; ``log_every`` (:func:`hvd_gradq.log.resolve_every`) says how often
  the telemetry logs a line.

Its mutable state lives in plain objects (:class:`Agreement`, :class:`~.stats.Stats`), never in a
dict or list attribute: TensorFlow's compressor is also a ``tf.Module``, which would wrap those
for checkpoint tracking.
"""
from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from .. import log
from ..errors import GradqError
from ..kernels import parallel
from ..plan import hosts
from ..plan.cpu_cost import Figures
from ..plan.decide import Choice, choose, decide, seconds
from ..plan.pattern import EVERY, ONE_RANK_WHY, REQUESTABLE, Pattern, compresses, in_warmup, parse_pattern, warmup_why
from ..plan.trial import START, Trial
from ..policy import Policy
from ..reduce import Group, handshake, stop, table
from ..reduce.names import Kind
from ..reduce.stats import KINDS, Reports, Stats
from ..schemes.scheme import Scheme
from ..spec import Config, SchemeLike, as_config
from . import link, prefetch, probe, workers
from .measured import Measured

#: A frontend's allgather for the handshake: (this rank's row, what it is, the seconds it may wait
#: for the other ranks) -> every rank's rows; past the wait it raises
#: :class:`hvd_gradq.reduce.handshake.Stalled` (Horovod cannot withdraw the collective).
Gather = Callable[[NDArray[Any], Kind, float], NDArray[Any]]
#: A frontend's float32 -> float16 -> float32 round trip (Horovod's fp16), as the probe times it.
Cast = Callable[[NDArray[np.float32]], Any]


def check_seed(seed: Any) -> int:
    """The rounding noise's base seed: an integer (a bool is refused: ``seed=True`` is a slip)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise GradqError(f"seed must be an integer, e.g. seed=0, not {type(seed).__name__}")
    return seed


def check_process_set(process_set: Any) -> Any:
    """``process_set=`` as given: None or a Horovod ``ProcessSet`` (anything with a ``process_set_id``)."""
    if process_set is not None and not hasattr(process_set, "process_set_id"):
        raise GradqError(f"process_set must be a horovod ProcessSet (hvd.add_process_set(...), "
                         f"hvd.global_process_set) or None, not {type(process_set).__name__}")
    return process_set


def ranks_on_host(horovod: Any) -> int | None:
    """Ranks on this host as a Horovod module (``horovod.torch``, ``horovod.tensorflow``) says;
    None before ``hvd.init()``, where it cannot (the launcher's count is then used)."""
    try:
        return int(horovod.local_size())
    except ValueError:
        return None


def final_scale(total: Any, v: Any, size: int, select: Callable[..., Any] | None = None,
                equal: Callable[[Any, Any], Any] | None = None, in_place: bool = False) -> Any:
    """Horovod's scaling of a compressed reduction: it reduced the compressor's ``[1.0]`` with
    the call's op and scale factors, so it came back as ``v = post * pre`` (Average) or
    ``post * pre * N`` (Sum), and stock Horovod's result is the decoded sum ``total`` times
    ``v / N``. Written ``total / N`` where ``v == 1`` and ``total`` where ``v == N`` so that the
    plain cases keep their bits. ``v`` a number: decided here (PyTorch); a traced scalar: by
    ``select(condition, then, otherwise)`` and ``equal`` (TensorFlow's ``tf.where``, ``tf.equal``).
    ``in_place``: scale an eager ``total`` (a NumPy array, a torch tensor) in place, the same bits
    without a second full-size array."""
    n = float(size)
    if select is None or equal is None:
        v = float(v)
        if v == n:
            return total
        if in_place:
            if v == 1.0:
                total /= n
            else:
                total *= v / n
            return total
        return total / n if v == 1.0 else total * (v / n)
    return select(equal(v, 1.0), total / n, select(equal(v, n), total, total * (v / n)))


@dataclass
class Agreement:
    """What the ranks of each process set agreed on at their first reduction (keys: the
    frontend's name for the set): whether they compared configurations, the CPU figures, and the
    link measured beside them (:mod:`.link`; its rate is also in the figures, which price with it)."""

    checked: set[Hashable] = field(default_factory=set)
    figures: dict[Hashable, Figures | None] = field(default_factory=dict)
    links: dict[Hashable, link.Link] = field(default_factory=dict)


class CompressorCore(Reports):
    """The framework-free part of a ``GradqCompressor`` (see the module docstring).

    A subclass sets the class attributes, calls :meth:`__init__` with the options it takes, and
    implements :meth:`_ranks` and :meth:`_ranks_a_host` (what ``stats()`` says of the run); its
    telemetry is ``self._telemetry`` (whose ``summary()`` is ``stats()``)."""

    #: the frontend's module (``hvd_gradq.torch``), as messages name it
    FRONTEND: ClassVar[str] = "hvd_gradq"
    #: the frontend as ``stats()['world']`` and the compared configuration name it
    WORLD_NAME: ClassVar[str] = ""
    CONFIG_TAG: ClassVar[str] = ""
    #: kinds of time its telemetry measures (:data:`hvd_gradq.reduce.stats.KINDS`)
    TIME_KINDS: ClassVar[tuple[str, ...]] = KINDS
    #: whether a reduction over one rank goes through untouched (Horovod's fp32 pass-through)
    PASSES_ONE_RANK: ClassVar[bool] = False
    #: patterns the frontend cannot run under an option that stops a step on a gradient's values
    #: (``nonfinite=raise``, ``fp16:overflow=raise``), and why, for the error
    UNPOISONABLE: ClassVar[frozenset[Pattern]] = frozenset()
    UNPOISONABLE_WHY: ClassVar[str] = ""
    #: whether ``auto`` measures its plans in the job (:mod:`hvd_gradq.plan.trial`): a frontend
    #: that can switch a tensor's plan from one step to the next (PyTorch's eager calls,
    #: TensorFlow's ``tf.switch_case``). Where it cannot, ``fallback`` is the cost model's, off by default.
    MEASURES: ClassVar[bool] = False

    settings: Config
    scheme: Scheme
    policy: Policy
    seed: int
    pattern: Pattern
    link_gbps: float
    fallback: bool
    threads: int
    check_ranks: bool
    process_set: Any
    handshake_timeout: float
    log_every: int

    def __init__(self, scheme: SchemeLike, *, seed: int = 0, pattern: str | Pattern = "auto",
                 check_ranks: bool = True, process_set: Any = None, link_gbps: float | None = None,
                 threads: int | None = None, fallback: bool | None = None, local_size: int | None = None,
                 log_every: int | None = None) -> None:
        """Check and normalise the options both frontends take; ``local_size``: the ranks on
        this host when Horovod can say (else the launcher's count), for the default ``threads``."""
        self.seed = check_seed(seed)
        self.settings = as_config(scheme)
        self.scheme, self.policy = self.settings.scheme, self.settings.policy
        self.pattern = parse_pattern(pattern)
        self.link_gbps = hosts.link_gbps(link_gbps)
        self.link_given = hosts.link_given(link_gbps)
        self.fallback = probe.resolve_fallback(fallback, default=self.MEASURES)
        self.check_ranks = bool(check_ranks)
        self.process_set = check_process_set(process_set)
        if self.pattern is Pattern.SUMMABLE:
            choose(self.scheme, 1, 1, 2, Pattern.SUMMABLE)  # refuse now, not at the first step
        stops = stop.stops_on_values(self.settings)
        if stops and self.pattern in self.UNPOISONABLE:
            raise GradqError(
                f"{stops} with pattern={self.pattern.value} is not supported by {self.FRONTEND}: "
                f"{self.UNPOISONABLE_WHY}. Use the option's default (nonfinite=propagate, fp16:overflow=inf) or "
                f"pattern={' / '.join(p.value for p in REQUESTABLE[1:] if p not in self.UNPOISONABLE)} / auto")
        self.threads = workers.configure_codec(threads, local_size)  # each encode/decode's threads
        log.env_level()  # a bad HVD_GRADQ_LOG fails at construction, not at the end of a step
        #: seconds each handshake collective waits for the other ranks (HVD_GRADQ_HANDSHAKE_TIMEOUT)
        self.handshake_timeout = handshake.timeout()
        self.log_every = log.resolve_every(log_every)
        self._stats = Stats(self.TIME_KINDS)
        self._agreement = Agreement()
        self._measured = self._new_measured()
        prefetch.start([self.scheme], probe.priced(self.pattern))  # kernels load as the job starts, not in its 1st step

    # -- the configuration ranks compare ------------------------------------------------------------
    def _scope(self) -> str:
        """The compressor's name in the configuration (TensorFlow's collectives' prefix); none here."""
        return ""

    def config(self) -> str:
        """What every rank must agree on."""
        return handshake.config_text(self.settings.full_spec, self.pattern.value, self.seed, self.CONFIG_TAG,
                                 self._scope())

    def digest(self) -> str:
        """A short hash of :meth:`config`: equal on ranks (and runs) that agree."""
        return hashlib.sha256(self.config().encode()).hexdigest()[:16]

    # -- the handshake, once a process set ------------------------------------------------------------
    @property
    def _checked(self) -> set[Hashable]:
        """The process sets whose ranks shook hands (an elastic reset clears it)."""
        return self._agreement.checked

    @property
    def _figures(self) -> dict[Hashable, Figures | None]:
        """The CPU figures each process set's ranks agreed on (None: one rank, or no collective)."""
        return self._agreement.figures

    def agreed(self, key: Hashable) -> Figures | None:
        """The CPU figures process set ``key`` agreed on: what :meth:`decide` prices with."""
        return self._agreement.figures.get(key)

    def handshake(self, key: Hashable, size: int, local: int, gather: Gather | None, cast: Cast) -> None:
        """At the first reduction over process set ``key`` (``size`` ranks, ``local`` a host),
        before anything depends on the configuration: every rank's configuration and cluster
        layout (:func:`hosts.layout`: what :meth:`decide` reads) compared by digest
        (:mod:`hvd_gradq.reduce.handshake`), a RankMismatchError naming the ranks and the fields on
        every rank if they differ and any rank has ``check_ranks`` (else a warning); then, where
        the cost model chooses, the CPU figures measured on each rank (``cast``: the frontend's
        fp16 round trip) and agreed. Ranks that disagreed would otherwise send payloads that
        decode to garbage, or wait in collectives the others never start. Every rank runs the
        same collectives, whatever its ``check_ranks``, reached at each one's first reduction, so
        no call order can make it wait for another tensor; each is waited for at most
        :attr:`handshake_timeout` seconds, then a GradqError says what was waited for.
        ``gather`` None: no collective can run now (a TF1-style graph): nothing is compared, the
        table prices."""
        if key in self._agreement.checked:
            return
        self._agreement.checked.add(key)
        if size <= 1 or gather is None:
            return
        text = self.config() + hosts.layout(size, local, self.link_gbps, self.fallback, self.pattern)

        def bounded(row: NDArray[Any], kind: Kind) -> NDArray[Any]:
            try:
                return gather(row, kind, self.handshake_timeout)
            except handshake.Stalled as e:
                raise handshake.stalled(e, self.FRONTEND, text, size) from None

        rows = handshake.read_blocks(bounded(handshake.config_block(text, self.check_ranks), Kind.CONFIG), size)
        if handshake.differ(rows):  # every rank read the same rows: all of them gather the texts
            texts = handshake.read_texts(bounded(handshake.text_block(text), Kind.CONFIG_TEXT), size)
            differences = handshake.settle(rows, texts)  # raised where any rank has check_ranks
            warnings.warn(f"{differences} (check_ranks=False on every rank: running on)", stacklevel=2)
        if probe.priced(self.pattern):
            figures = probe.agreed(self.scheme, size, local, cast, lambda row: bounded(row, Kind.CPU))
            self._agreement.figures[key] = link.agreed(figures, lambda row: bounded(row, Kind.LINK), size,
                                                       self.link_given, self._agreement.links, key)

    def forget_handshakes(self) -> None:
        """A new world (elastic reset): every process set shakes hands again, and ``auto``
        measures its plans again in it (every rank of the new world from the same step)."""
        self._agreement.checked.clear()
        self._agreement.figures.clear()
        self._agreement.links.clear()
        self._measured = self._new_measured()

    # -- the measured choice (plan/trial.py, .measured) --------------------------------------------
    def _new_measured(self) -> Measured:
        """A trial where ``auto`` measures (this frontend can, and ``fallback`` is on); the
        policy's warm-up steps run first (they are fp32, not the plans the trial would time)."""
        if self.pattern is not Pattern.AUTO:
            return Measured(None, "not measured: pattern= names a pattern")
        if not self.MEASURES:
            return Measured(None, "not measured by this frontend: the cost model decides")
        if not self.fallback:
            return Measured(None, "not measured: fallback=False (the cost model decides)")
        return Measured(Trial(start=self.policy.warmup + START))

    @property
    def trial(self) -> Trial | None:
        """The measured choice's state (None: ``auto`` does not measure here)."""
        return self._measured.trial

    def trial_step(self, key: Hashable, size: int, gather: Gather | None) -> None:
        """At a step's first reduction: :meth:`.measured.Measured.step`."""
        self._measured.step(key, size, gather, self.handshake_timeout, self.FRONTEND, self._auto_report)

    def planned(self, name: str, n: int, ndim: int, size: int, local: int, model: Choice) -> Choice:
        """Tensor ``name``'s choice under this step's measured plan, ``model`` being the cost
        model's (:meth:`decide` without the model: a graph frontend priced it when it traced)."""
        return self._measured.choose(name, n, ndim, size, local, model)

    def stats(self) -> dict[str, Any]:
        """:meth:`Reports.stats`, and what ``auto``'s measured choice took and why
        (``stats()['auto']``: :meth:`.measured.Measured.report`, the cost model's seconds beside)."""
        out = super().stats()
        out["auto"] = self._auto_report()
        return out

    def _auto_report(self) -> dict[str, Any]:
        m = self._measured
        figures = self.agreed(m.key)
        return m.report(lambda n, nd, s, loc: self._model(n, nd, s, loc, figures),
                        lambda n, nd, s, loc, p: seconds(self.scheme, n, nd, s, p, loc,
                                                         link.rate_of(figures, self.link_gbps), figures))

    def reduction_set(self, called: Any, global_set: Any) -> Any:
        """The process set a reduction runs on: the one Horovod's call names, else the
        constructor's, else ``global_set``; when both name one, they must be the same set."""
        own = self.process_set
        if own is not None and called is not None and own.process_set_id != called.process_set_id:
            raise GradqError(
                f"the compressor was built with process_set={own.process_set_id} but Horovod reduces this "
                f"gradient over process set {called.process_set_id}: pass the same process set to both (or to "
                "Horovod only)")
        return called if called is not None else own if own is not None else global_set

    # -- the decision and the warm-up -----------------------------------------------------------------
    def offered(self) -> frozenset[Pattern]:
        """The patterns ``auto`` may take: all but those this frontend cannot run with this policy."""
        return EVERY - self.UNPOISONABLE if stop.stops_on_values(self.settings) else EVERY

    def decide(self, n: int, ndim: int, size: int, local: int, figures: Figures | None,
               name: str | None = None) -> Choice:
        """How tensor ``name`` of ``n`` elements (``ndim`` dimensions) is reduced over ``size``
        ranks, ``local`` a host, and why (:func:`hvd_gradq.plan.decide.decide` with this
        compressor's options and ``figures``, the CPU figures its ranks agreed on: :meth:`agreed`),
        under the measured plan of this step where ``auto`` measures (:meth:`trial_step`); before warm-up."""
        if size == 1 and self.PASSES_ONE_RANK:
            return Choice(Pattern.FP32, ONE_RANK_WHY)
        return self._measured.choose(name, n, ndim, size, local, self._model(n, ndim, size, local, figures))

    def _model(self, n: int, ndim: int, size: int, local: int, figures: Figures | None) -> Choice:
        """The cost model's decision; its own fp16 fallback only where nothing is measured."""
        return decide(self.settings, n, ndim, size, self.pattern, self.offered(), local,
                      link.rate_of(figures, self.link_gbps), self.fallback and not self.MEASURES, figures)

    def owned(self, name: str, n: int, ndim: int, group: Group) -> list[tuple[str, int, int]]:
        """(key, lo, hi) of each owner residual tensor ``name`` keeps under the pattern the cost
        model compresses it with (:func:`hvd_gradq.reduce.table.owned`): what a step that sends
        it uncompressed delivers with its own residual."""
        model = self._model(n, ndim, group.size, group.local, self.agreed(group.key))
        return table.owned(model, name, n, self.scheme.bucket, group)

    def warm(self, choice: Choice, step: int) -> Choice:
        """A decision at a tensor's ``step`` (0-based, counted while it compresses): Horovod's
        exact fp32 during the policy's warm-up (:func:`hvd_gradq.plan.pattern.in_warmup`), else as decided."""
        if compresses(choice.pattern) and in_warmup(self.policy, step):
            return Choice(Pattern.FP32, warmup_why(self.policy, step, choice.pattern))
        return choice

    def warm_note(self, choice: Choice) -> str:
        """The reason of a decision whose warm-up a graph picks at run time (TensorFlow's
        ``tf.cond`` on the step counter): it says once that the first steps go fp32."""
        k, why = self.policy.warmup, choice.why
        if compresses(choice.pattern) and k > 0:
            why += f"; the first {k} step{'s' if k > 1 else ''} fp32 (warm-up)"
        return why

    # -- what stats() says of the run -----------------------------------------------------------------
    def _ranks(self) -> int | None:
        """Ranks in the job (None before Horovod is initialized)."""
        raise NotImplementedError

    def _ranks_a_host(self) -> int:
        """Ranks a host as the cost model sees them (:func:`hosts.ranks_per_host`)."""
        raise NotImplementedError

    def _hosts(self) -> int | None:
        """Hosts the job runs on, as Horovod counts them (None where it cannot say: before
        ``hvd.init()``, hosts not alike): what the log tells a user, beside the cost model's view."""
        return None

    def _world_extra(self) -> dict[str, Any]:
        """What a frontend adds to :meth:`world` (PyTorch: its threads and codec)."""
        return {}

    def _intra_op_threads(self) -> int | None:
        """The threads the framework's own operations use (its intra-op pool; 0: the framework's
        default, a thread a core of the machine), or None where it cannot say."""
        return None

    def world(self) -> dict[str, Any]:
        """What ``stats()`` and the log say of the run: ``intra_op_threads`` beside ``rank_cores``
        (this rank's share of its host's cores) lets the log say when they oversubscribe;
        ``link_gbps`` is the rate the cost model prices with, ``link`` where it came from (the
        measurement of the first process set that measured: :mod:`.link`)."""
        threads = self._intra_op_threads()
        measured = next(iter(self._agreement.links.values()), None)
        return {"frontend": self.WORLD_NAME, "scheme": self.settings.spec, "pattern": self.pattern.value,
                "ranks": self._ranks(), "hosts": self._hosts(), "ranks_a_host": self._ranks_a_host(),
                "link_gbps": measured.gbps if measured is not None else self.link_gbps,
                "link": measured.describe() if measured is not None else "given" if self.link_given else "default",
                "intra_op_threads": parallel.cores() if threads == 0 else threads,
                "rank_cores": parallel.rank_cores(), **self._world_extra()}
