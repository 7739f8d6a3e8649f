"""The hetpart exception family.

Every error a user can cause derives from :class:`HetpartError`. A message names
the thing at fault (op, device, file, key), the rule it broke, and what to do
about it. The CLI prints the message alone; ``--debug`` shows the traceback.
"""

from __future__ import annotations


class HetpartError(Exception):
    """Base class of every error hetpart raises on purpose."""


class GraphError(HetpartError):
    """An OpGraph whose parts do not fit together (dangling tensor, cycle, duplicate name)."""


class UnknownModel(HetpartError, KeyError):
    """A model name or ``file.py:factory`` spec that does not resolve."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class CaptureError(HetpartError):
    """torch.export / symbolic_trace / the fake-tensor pass failed on a model."""


class ProfileError(HetpartError, ValueError):
    """A device profile (TOML file or dict) is malformed: names the file, key and expected form."""


class UnitError(ProfileError):
    """A quantity string such as ``"64GiB"`` or ``"55GB/s"`` could not be parsed."""


class UnsupportedOp(HetpartError):
    """An op that no device of the profile can run."""


class InfeasiblePlacement(HetpartError):
    """No placement satisfies the memory caps and pins."""


class NoPlanFits(InfeasiblePlacement):
    """At run time, neither a plan nor any of its fallbacks fits the memory free on the devices now."""


class CheckpointError(HetpartError):
    """A model folder or weights file that cannot be planned or loaded (the message names the file and key)."""


class GenerationError(HetpartError):
    """A ``generate`` request the emitted generation loop cannot run as asked (a prompt longer than
    planned, more sequences than the cache holds, sampling settings out of range)."""


class PlanMismatch(HetpartError):
    """A plan file that does not belong to the model or profile it is used with."""


class VerificationError(HetpartError):
    """A stage produced a value that breaks an invariant (a bug, or a hand-edited plan)."""


class SolverUnavailable(HetpartError):
    """The requested solver is not installed or not known."""


class DeviceMismatch(VerificationError):
    """A placed program read a tensor on another device than the op's (strict-devices check)."""


class OnnxError(HetpartError):
    """An ONNX model hetpart cannot read or run: names the file, node or input and the fix."""


class InputShapeError(OnnxError):
    """Input shapes that do not fit an ONNX model (unknown input, wrong rank, a fixed dimension contradicted)."""


class PipelineRunError(HetpartError):
    """A pipeline run that cannot start or did not finish: a launch that does not match the plan
    (world size, rank), or a rank that stopped (the others stop with this error within a timeout)."""
