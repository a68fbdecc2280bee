"""runs-fleet's queue processors: termination and housekeeping queues, cleanup tasks, dead letters,
and the pool audit.

Plain modules over boto3 clients (no Dagster imports): ``messages`` (parsing and validation),
``calls`` (runs-fleet's retry of one AWS call), ``context`` (the clients and names the processors
work with), ``queues`` (SQS: depth, receive, batched send and delete), ``dead_letter_send`` (sending
poison messages to a dead-letter queue), ``ssm_parameters`` (deleting runners' SSM parameters; run
config is declared in ``params`` modules), ``metrics`` (batched CloudWatch metrics), ``archive``
(the raw-message archive and archived-job markers), ``drain`` (the receive loop with graceful stop,
and its parameters), ``termination``, ``housekeeping`` (the one list of housekeeping tasks and
their dispatcher), the ``tasks`` subpackage (runs-fleet's clean-up tasks, one module each),
``dead_letter_redrive`` (the ``redrive_dead_letters`` job's logic: SQS dead letters back to their
source queue, and quarantine; not ``pipelines.redrive``, which relaunches failed partitions), and
the ``pool_audit`` subpackage (its ``housekeeping`` module is the ``pool_audit`` task). The
``defs`` subpackage is the thin Dagster layer (jobs, sensors, schedules, checks, the pool audit's
assets).
"""
