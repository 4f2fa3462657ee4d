"""The planning wing: what the workflow decides about a run while the DAG is built, before any
job runs. Everything here runs where Snakemake runs (a login node's driver venv included): no
framework, protobuf or Triton client import. Importing this package imports none of its modules.

How a setting travels, in order (docs/configuration.md, "From a setting to its process"):

- ``workflow_config``: the config file, validated and resolved for one
  ``{model}/{gpu}/{format}/{precision}`` run (``resolve``), and every run a target names
  (``all_runs``).
- ``run_plan``: ``plan_run`` turns the resolved run into one frozen ``RunPlan``, decided once:
  its export (``export_plan``), conversion (``conversion_plan``, with ``engines`` for TensorRT
  engines over batch sizes), serving (``serving_plan``, with ``backends``: Triton's platforms),
  measurement (its points and ``MeasureSettings`` fields) and cluster requests
  (``resources``; ``measurement_memory`` for a measuring job's memory).
- ``job_specs``: the plain values each step's job receives (``RunPlan.spec``), which the rules
  pass as ``params`` and the jobs (``deploybench.jobs``) read.
- Around it: ``preflight_plan`` (an image's checks on a GPU), ``config_search_plan`` (a
  serving-configuration search's candidates as plans of their own), ``schedule`` (a run's jobs
  within a partition's time limit) with ``parts`` (a scenario measured in parts merged back).
"""
