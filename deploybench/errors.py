"""Every error deploybench raises on purpose, in one hierarchy (as ``requests.exceptions``).

Catch ``DeploybenchError`` for any of them. Each also derives from the built-in exception its
callers caught before there was a hierarchy (``ValueError`` for bad input, ``RuntimeError`` for
a failed step), so ``except ValueError`` keeps working.
"""

from __future__ import annotations

import pickle


class DeploybenchError(Exception):
    """Base class of every error deploybench raises on purpose."""


# --- bad input: config values, checkpoints, data files --------------------------------------


class ConfigError(DeploybenchError, ValueError):
    """A run or config value that the workflow cannot honour."""


class CheckpointError(DeploybenchError, ValueError):
    """A checkpoint that cannot be read, or does not fit the configured network."""


class UnsafePickleError(CheckpointError, pickle.UnpicklingError):
    """A pickle names a global that loading it could run, or tries to change one."""


# --- a step that failed ---------------------------------------------------------------------


class ConversionError(DeploybenchError, RuntimeError):
    """A conversion that would serve something other than its row says: weights that the
    target precision cannot hold, or an engine that was not built."""


class AccuracyError(DeploybenchError):
    """The served model does not match the framework within tolerance, or misses its task
    metric's threshold."""


class PerfError(DeploybenchError, RuntimeError):
    """perf_analyzer failed for a reason other than an unstable measurement."""


class ServerError(DeploybenchError, RuntimeError):
    """The server could not be started or made ready."""


class ToolNotFound(DeploybenchError, RuntimeError):
    """An executable the step needs (tritonserver, perf_analyzer, trtexec) is not installed."""


class NeedsGPU(DeploybenchError, RuntimeError):
    """The step must run on a GPU node (e.g. submitted with ``--profile profiles/slurm``)."""


class SearchError(DeploybenchError, RuntimeError):
    """No candidate of a serving-configuration search meets its latency budget and throughput
    floor, or its measurements cannot be read."""


class PreflightError(DeploybenchError, RuntimeError):
    """A preflight check failed: the GPU, driver, image or tools the runs need are not there."""


class ArtifactChanged(DeploybenchError, RuntimeError):
    """A result differs from what the job that wrote it recorded (truncated, corrupt, replaced)."""


class EngineVersionMismatch(DeploybenchError, RuntimeError):
    """A TensorRT engine (a plan, a TF-TRT SavedModel's) built by another TensorRT version than
    the one that would load it, or by an unknown one: it would fail only when the server loads
    it (deploybench.trt_version)."""


class DataError(DeploybenchError, ValueError):
    """A task data set (DLE's pre-processed files) that cannot be read as its model needs."""


class ResultsError(DeploybenchError, ValueError):
    """A results table or record (a search's points or candidates CSV, its choice JSON) that
    lacks the columns or keys a chart or report section needs."""


class LockError(DeploybenchError, ValueError):
    """An image's lock file (envs/containers/<image>.lock) that is missing, was made from other
    requirements or image settings than the config's now (stale), or does not cover them."""


class ImageBuildError(DeploybenchError, RuntimeError):
    """An image cannot be built here: an Apptainer older than the definitions need, or no
    network to pull the base and install the lock."""


class ResolveError(DeploybenchError, RuntimeError):
    """The resolver (uv) could not lock an image's requirements."""


class InputNotFound(DeploybenchError, FileNotFoundError):
    """A configured input (checkpoint, data set, one of its files) does not exist."""
