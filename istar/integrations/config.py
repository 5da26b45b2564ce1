"""The settings every integration shares: :class:`IStarConfig`, and what they do with a model.

One :class:`IStarConfig` drives each form the library offers (the ``transformers.Trainer``,
the model wrapper, the sentence-transformers loss): which method of the registry
(:mod:`istar.registry.methods`) adds its penalty, its λ and ζ within the config schema's ranges,
and where Σ_S comes from: computed from the current model (before training and, with
``recompute_shrinkage``, at each later epoch's start), or given — a (d, d) tensor or the file
``istar shrinkage`` writes — for the first epoch, then refreshed or kept.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from istar.config.schema import default_of, out_of_range, schema_entry
from istar.core.isotropy import check_sigma_s, isoscore_star_from_covariance
from istar.core.regularizers import LayerSelection, Penalty, resolve_layers
from istar.core.shrinkage import current_processes, load_shrinkage
from istar.core.tokens import get_token_selection
from istar.io.artifacts import DamagedArtifactError, write_json
from istar.models import shrinkage
from istar.models.shrinkage import shrinkage_covariance
from istar.registry.methods import Method, get_method

__all__ = ["IStarConfig", "check_mask", "SigmaSchedule", "IStarHolder", "penalty_logs", "LogMeans", "ISTAR_SETTINGS"]

ISTAR_SETTINGS = "istar_config.json"
"""The file each integration's saved model folder holds beside the weights (:meth:`IStarHolder.save_settings`):
the I-STAR settings and where Σ_S came from."""


@dataclass(frozen=True)
class IStarConfig:
    """The I-STAR (or CosReg) settings of a training run; the defaults are the workflow's config schema's.

    Parameters
    ----------
    lam : float, optional
        λ, the penalty's weight, in the schema's range [−100, 100]. For I-STAR: < 0 lowers
        isotropy (the paper's winning direction), > 0 raises it, 0 adds no gradient but still logs
        IsoScore* (the baseline to compare with); required. For CosReg: default 1 (the schema's
        ``final.cosreg_lambda``), which lowers the mean cosine similarity.
    zeta : float, optional
        ζ ∈ [0, 1], the weight of Σ_S in Σ_ζ = (1 − ζ)·Σ_X + ζ·Σ_S (the paper's Eq. 3); 0 needs no
        Σ_S (none is computed). Default 0.2 (the schema's ``$defs.zeta``) for a method that takes
        it, 0 otherwise (CosReg takes none).
    method : str
        A key of :data:`istar.registry.methods.METHODS`: ``"istar"`` (default), ``"cosreg"``, or
        ``"base"`` (the task loss alone).
    layers : str, int or list of int
        The hidden states I-STAR's penalty and Σ_S read (default ``"all"``: every transformer
        layer; :data:`istar.core.regularizers.LayerSelection`). CosReg reads the last layer whatever it is.
    tokens : str
        ``"real"`` (the attention-masked tokens, the default) or ``"all_positions"`` (every padded
        position, as the authors' code).
    shrinkage_rows : int
        Σ_S's row budget, tokens × layers (default 250,000, as in the paper; the config's
        ``shrinkage.rows``).
    recompute_shrinkage : bool
        Recompute Σ_S from the current model at each later epoch's start (default True, as the
        paper; the config's ``shrinkage.recompute_every_epoch``); False keeps the first Σ_S
        (computed or given) for the whole run.
    global_penalty : bool
        Under several processes, penalise the global batch's IsoScore* (default False, as the
        authors' code: each process its own batch).
    sigma_s : torch.Tensor, str or os.PathLike, optional
        The first epoch's Σ_S instead of one computed from the model: a (d, d) tensor (d the model's
        hidden size) or the path of the file ``istar shrinkage`` writes (its Σ_S is rebuilt for
        ``layers``). Needs a method that shrinks (I-STAR with ζ > 0).

    Raises
    ------
    ValueError
        An unknown method, a hyperparameter the method does not take, λ or ζ out of the schema's
        range, a missing λ for I-STAR, or a ``sigma_s`` that is not (d, d) or that nothing reads.

    Examples
    --------
    >>> from istar import IStarConfig
    >>> IStarConfig(lam=-1.0, zeta=0.2).zeta
    0.2
    >>> IStarConfig(method="cosreg").lam
    1.0
    """

    lam: float | None = None
    zeta: float | None = None
    method: str = "istar"
    layers: LayerSelection = default_of("penalty.layers")
    tokens: str = default_of("penalty.tokens")
    shrinkage_rows: int = default_of("shrinkage.rows")
    recompute_shrinkage: bool = default_of("shrinkage.recompute_every_epoch")
    global_penalty: bool = default_of("penalty.global_penalty")
    sigma_s: torch.Tensor | str | os.PathLike | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        method = get_method(self.method)
        object.__setattr__(self, "lam", self._resolved("lam", self.lam, method, "$defs.lambda"))
        object.__setattr__(self, "zeta", self._resolved("zeta", self.zeta, method, "$defs.zeta"))
        get_token_selection(self.tokens)
        if self.sigma_s is not None and not method.needs_sigma_s(self.zeta):
            raise ValueError(f"sigma_s is given but method={self.method!r} with zeta={self.zeta} reads no Σ_S: "
                             "use method='istar' with zeta > 0, or leave sigma_s out")
        if isinstance(self.sigma_s, torch.Tensor):
            object.__setattr__(self, "sigma_s", check_sigma_s(self.sigma_s))

    def _resolved(self, name: str, value, method: Method, schema_key: str) -> float:
        """``value`` checked against the method and the schema's range, or the method's default for it."""
        if value is None:
            if not method.takes(name):
                return 0.0
            if name == "lam" and method.default_lam_key is None:
                raise ValueError(f"method {method.key!r} needs lam (λ): IStarConfig(lam=-1.0, zeta=0.2), say")
            return float(default_of(method.default_lam_key if name == "lam" else schema_key))
        if not method.takes(name) and value != 0:
            raise ValueError(f"method {method.key!r} takes no {name}; got {name}={value}: leave it out")
        if (problem := out_of_range(value, schema_entry(schema_key))) is not None:
            raise ValueError(f"{name} must {problem}; got {value!r}")
        return float(value)

    @property
    def entry(self) -> Method:
        """The method's registry entry (:class:`istar.registry.methods.Method`)."""
        return get_method(self.method)

    @property
    def needs_sigma_s(self) -> bool:
        """Whether the penalty shrinks towards a Σ_S (I-STAR with ζ > 0)."""
        return self.entry.needs_sigma_s(self.zeta)

    def penalty(self, hidden_states, attention_mask, sigma_s: torch.Tensor | None) -> Penalty | None:
        """The method's penalty of one batch, or None for a method that adds none (``base``).

        Parameters
        ----------
        hidden_states : tuple of L + 1 tensors (B, T, d), ``outputs.hidden_states``.
        attention_mask : (B, T) tensor, non-zero at real tokens (None with ``tokens="all_positions"``).
        sigma_s : (d, d) Σ_S on the hidden states' device, or None when ζ = 0.
        """
        return self.entry.penalise(hidden_states, attention_mask, lam=self.lam, zeta=self.zeta, sigma_s=sigma_s,
                                   layers=self.layers, global_batch=self.global_penalty, tokens=self.tokens)

    def given_sigma_s(self, model) -> torch.Tensor | None:
        """The ``sigma_s`` given, as (d, d) float64 on ``model``'s device, checked against its hidden size.

        Raises ``ValueError`` naming both shapes when it is another model's Σ_S.
        """
        if self.sigma_s is None:
            return None
        hidden_size, sigma = int(model.config.hidden_size), self.sigma_s
        if not isinstance(sigma, torch.Tensor):
            states = int(model.config.num_hidden_layers) + 1
            try:
                sigma, _ = load_shrinkage(self.sigma_s, resolve_layers(self.layers, states))
            except DamagedArtifactError as error:  # the workflow's fix (snakemake) means nothing to a library user
                raise DamagedArtifactError(error.path, error.problem, fix="write it again with `istar shrinkage`, or "
                                           "give IStarConfig(sigma_s=istar.shrinkage_covariance(model, loader))"
                                           ) from None
        if tuple(sigma.shape) != (hidden_size, hidden_size):
            raise ValueError(f"sigma_s has shape {tuple(sigma.shape)} but the model's hidden states have d = "
                             f"{hidden_size}, so Σ_S must be ({hidden_size}, {hidden_size}): give the Σ_S of this "
                             "model (istar.shrinkage_covariance or `istar shrinkage`)")
        return sigma.to(device=next(model.parameters()).device, dtype=torch.float64)


def check_mask(batch, config: IStarConfig, where: str = "the training batches") -> None:
    """Refuse a batch without the ``attention_mask`` the penalty needs (before any Σ_S pass or step)."""
    if "attention_mask" not in batch and get_token_selection(config.tokens).masked:
        raise ValueError(f"{where} have no attention_mask (keys: {', '.join(batch)}): keep the tokenizer's "
                         "attention_mask in the dataset (and a collator such as DataCollatorWithPadding), so that "
                         "the penalty leaves padding out")


class SigmaSchedule(shrinkage.SigmaSchedule):
    """The Σ_S of a config at each epoch's start: :class:`istar.models.shrinkage.SigmaSchedule`'s rule with
    ``needed`` and ``recompute`` from ``config``; the given Σ_S is the config's ``sigma_s``.

    Attributes
    ----------
    sigma_s : torch.Tensor or None
        The current Σ_S, (d, d) float64 on the model's device.
    sigma_epoch : int
        The epoch whose start Σ_S was set at (−1 before the first).
    source : str or None
        Where the current Σ_S came from: ``"a tensor given"``, the given file's path, the model over the data
        it was computed from (``computed_from`` of :meth:`update`), or a checkpoint's file.
    """

    def __init__(self, config: IStarConfig):
        super().__init__(config.needs_sigma_s, config.recompute_shrinkage)
        self.config = config
        self.source: str | None = None

    def update(self, epoch: int, model, loader, accelerator=None, progress: bool = True,
               computed_from: str = "the model") -> float | None:
        """Set Σ_S for ``epoch`` if :meth:`due`: the given one at the first epoch, else computed over ``loader``
        (``computed_from`` names it for :attr:`source`, e.g. ``"the model over sigma_data"``).

        ``model`` is the unwrapped Hugging Face model. Returns IsoScore of the new Σ_S (what the
        integrations log as ``sigma_s_isoscore``), or None when nothing changed or none is needed.
        """
        config = self.config

        def given():
            self.source = "a tensor given" if isinstance(config.sigma_s, torch.Tensor) else str(config.sigma_s)
            return config.given_sigma_s(model)

        def computed():
            self.source = computed_from
            return shrinkage_covariance(model, loader, layers=config.layers, tokens=config.tokens,
                                        shrinkage_rows=config.shrinkage_rows, accelerator=accelerator,
                                        progress=progress, description=f"Σ_S at epoch {epoch + 1}")

        sigma = self.advance(epoch, given=given, compute=computed)
        if sigma is None:
            return None
        return float(isoscore_star_from_covariance(sigma))  # IsoScore: ζ = 0


class IStarHolder:
    """What each integration (the Trainer mixin, IStarModel, IStarLoss) holds: its :class:`IStarConfig` as ``istar``,
    the per-epoch Σ_S schedule and the means of the penalty's logs; the Σ_S in use is read through it."""

    def _hold(self, istar: IStarConfig, usage: str) -> None:
        """Keep ``istar`` with a new schedule and log means; a TypeError showing ``usage`` (the call that makes an
        IStarConfig) unless it is an IStarConfig."""
        if not isinstance(istar, IStarConfig):
            raise TypeError(f"istar must be an IStarConfig ({usage}); got {type(istar).__name__}")
        self.istar, self._schedule, self._istar_logs = istar, SigmaSchedule(istar), LogMeans()

    @property
    def sigma_s(self) -> torch.Tensor | None:
        """The current Σ_S, (d, d) float64 on the model's device (None before the first epoch's, or with ζ = 0)."""
        return self._schedule.sigma_s

    @property
    def sigma_epoch(self) -> int:
        """The epoch whose start Σ_S was set at (−1 before the first)."""
        return self._schedule.sigma_epoch

    def save_settings(self, folder) -> None:
        """Write :data:`ISTAR_SETTINGS` into ``folder``: the :class:`IStarConfig` (``sigma_s`` aside) and the Σ_S
        in use (where it came from, the epoch it was set at and its shape; ``null`` when there is none)."""
        settings = {f.name: getattr(self.istar, f.name) for f in dataclasses.fields(self.istar) if f.name != "sigma_s"}
        sigma = None if self.sigma_s is None else {"from": self._schedule.source, "epoch": self.sigma_epoch,
                                                   "shape": list(self.sigma_s.shape)}
        write_json(Path(folder) / ISTAR_SETTINGS, {"istar": settings, "sigma_s": sigma})


def penalty_logs(config: IStarConfig, task_loss: torch.Tensor, penalty: Penalty | None) -> dict[str, torch.Tensor]:
    """What a training step logs: ``task_loss``, ``<method>_penalty`` (λ·term) and the penalty's own measures.

    For I-STAR: ``task_loss``, ``istar_penalty``, ``isoscore_star``; for CosReg: ``task_loss``,
    ``cosreg_penalty``, ``cosine_similarity``. Values are detached 0-d tensors.
    """
    logs = {"task_loss": task_loss.detach()}
    if penalty is not None:
        logs[f"{config.method}_penalty"] = penalty.term.detach()
        logs.update({key: value for key, value in penalty.logs.items() if key != "penalty_rows"})
    return logs


class LogMeans:
    """The means of a training step's logs (:func:`penalty_logs`) since they were last read, summed on the device."""

    def __init__(self):
        self.sums: dict[str, torch.Tensor] = {}
        self.batches = 0

    def add(self, values: dict[str, torch.Tensor]) -> None:
        """Add one micro-batch's values (no synchronisation with the device)."""
        for key, value in values.items():
            self.sums[key] = self.sums.get(key, 0.0) + value.detach().float()
        self.batches += 1

    def pop(self, accelerator=None) -> dict[str, float]:
        """The means since the last call, averaged over the processes (``accelerator``'s, else an initialised
        ``torch.distributed`` group's: :func:`istar.core.shrinkage.current_processes`), and start again.

        Every process must call it at the same point (a collective when there are several)."""
        if not self.batches:
            return {}
        keys = list(self.sums)
        means = torch.stack([self.sums[key] for key in keys]) / self.batches
        processes = current_processes(accelerator)
        if processes.gather is not None:
            means = processes.gather(means.to(processes.device).unsqueeze(0)).mean(dim=0)
        self.sums, self.batches = {}, 0
        return dict(zip(keys, means.tolist()))
