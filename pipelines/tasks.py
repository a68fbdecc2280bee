"""Every task that runs as a job of its own (``pipelines.common.task``), one line each: the one
adapter (``pipelines.common.defs.tasks``) builds each one's job and schedules, and
``tests/test_task_adapter.py`` checks them all. The fleet's housekeeping tasks run through the
``housekeeping`` job and queue instead: their list is ``pipelines.fleet.housekeeping.TASKS``."""

from pipelines.common.task import Task
from pipelines.fleet import dead_letter_redrive
from pipelines.progressor import task as progressor

TASKS: tuple[Task, ...] = (
    progressor.TASK,
    dead_letter_redrive.TASK,
)
