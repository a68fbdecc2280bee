"""Every task that runs as a job of its own; housekeeping tasks are ``pipelines.fleet.housekeeping.TASKS``."""

from pipelines.common.task import Task
from pipelines.fleet import dead_letter_redrive
from pipelines.progressor import task as progressor

TASKS: tuple[Task, ...] = (
    progressor.TASK,
    dead_letter_redrive.TASK,
)
