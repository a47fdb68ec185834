"""The components the trainer ships, in the order their hooks run.

At the end of a step the profile closes, the step is logged, then measured. Each builds itself
from its section of the settings and the run's parts (``Component.from_context``); components
added from outside run after them, and the checkpoint, last, saves it all. A new one is its
module and its line here.
"""

from __future__ import annotations

from training.components import Component
from training.instruments.grad_norms import GradNorms
from training.instruments.measurements import Diagnostics, Downstream, Validation
from training.instruments.outliers import Outliers
from training.instruments.profiling import Profiling
from training.instruments.step_log import StepLog
from training.runtime.float8 import Float8Scales
from training.step_health import StepHealth

SHIPPED: tuple[type[Component], ...] = (
    StepHealth,
    GradNorms,
    Outliers,
    Profiling,
    StepLog,
    Diagnostics,
    Validation,
    Downstream,
    Float8Scales,
)
