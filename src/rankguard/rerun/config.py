"""Rerun state machine configuration (Megatron Bridge's ``RerunStateMachineConfig`` names).

No torch here: the launcher validates it with the rest of the configuration.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rankguard.util.validate import check_number

__all__ = ["INJECTION_TYPES", "MODES", "ON_REPRODUCIBLE", "RerunStateMachineConfig"]

MODES = ("disabled", "validate_results", "report_determinism_stats")
_MODE_ALIASES = {"report_stats": "report_determinism_stats"}  # Megatron Bridge's spelling
INJECTION_TYPES = ("correct_result", "transient_error", "persistent_error")
ON_REPRODUCIBLE = ("stop", "skip")


@dataclass(kw_only=True, slots=True)
class RerunStateMachineConfig:
    """Re-run an iteration whose result failed a check to tell a transient fault (a
    different result in place), a faulty GPU (a different result on other hardware) and
    a real data or model problem (the same result everywhere) apart."""

    rerun_mode: str = field(
        default="disabled",
        metadata={
            "help": "disabled | validate_results | report_determinism_stats (Megatron "
            "Bridge's report_stats is accepted)."
        },
    )
    check_for_nan_in_loss: bool = field(
        default=True, metadata={"help": "A NaN or Inf loss fails validation (fatal)."}
    )
    check_for_spiky_loss: bool = field(
        default=False,
        metadata={"help": "|loss| >= spiky_loss_factor x the largest seen fails (not fatal)."},
    )
    spiky_loss_factor: float = field(
        default=10.0, metadata={"help": "How many times the largest loss seen is a spike."}
    )
    spiky_loss_warmup: int = field(
        default=100,
        metadata={"help": "Losses seen before spiky-loss detection starts (warm-up samples)."},
    )
    error_injection_rate: int = field(
        default=0,
        metadata={
            "help": "Inject a failed validation about once every N validations per rank "
            "(0: never); tests the whole path."
        },
    )
    error_injection_type: str = field(
        default="transient_error",
        metadata={"help": "correct_result | transient_error | persistent_error."},
    )
    error_injection_seed: int = field(
        default=0, metadata={"help": "Seed of the injector's own generator (per rank)."}
    )
    determinism_stats_interval: int = field(
        default=100,
        metadata={"help": "report_determinism_stats: re-run every N iterations."},
    )
    on_reproducible: str = field(
        default="stop",
        metadata={
            "help": "A failed fatal check that reproduces on other hardware (a data or "
            "model problem): stop the job, or skip the batch and go on."
        },
    )

    def __post_init__(self) -> None:
        self.rerun_mode = _MODE_ALIASES.get(self.rerun_mode, self.rerun_mode)
        if self.rerun_mode not in MODES:
            raise ValueError(
                f"rerun_mode: one of {list(MODES)} (or report_stats), got {self.rerun_mode!r}"
            )
        if self.error_injection_type not in INJECTION_TYPES:
            raise ValueError(
                f"error_injection_type: one of {list(INJECTION_TYPES)}, "
                f"got {self.error_injection_type!r}"
            )
        if self.on_reproducible not in ON_REPRODUCIBLE:
            raise ValueError(
                f"on_reproducible: one of {list(ON_REPRODUCIBLE)}, got {self.on_reproducible!r}"
            )
        check_number("spiky_loss_factor", self.spiky_loss_factor, gt=1)
        for name in ("spiky_loss_warmup", "error_injection_rate", "error_injection_seed"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"{name}: an integer >= 0, got {value!r}")
        interval = self.determinism_stats_interval
        if type(interval) is not int or interval < 1:
            raise ValueError(f"determinism_stats_interval: an integer >= 1, got {interval!r}")

    @property
    def enabled(self) -> bool:
        return self.rerun_mode != "disabled"

    def warnings(self) -> list[str]:
        """Settings that cannot take effect as written."""
        out = []
        if self.rerun_mode == "disabled" and self.error_injection_rate:
            out.append(
                "rerun_state_machine.error_injection_rate is set but rerun_mode=disabled: "
                "nothing is injected"
            )
        if self.enabled and not (self.check_for_nan_in_loss or self.check_for_spiky_loss):
            out.append(
                "rerun_state_machine: both loss checks are off: only the script's own "
                "validate_result() calls are checked"
            )
        return out
