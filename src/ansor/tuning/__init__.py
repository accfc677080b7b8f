"""The tuning job, in one place.

- `options`: `TuneOptions`, every knob of a job, typed and checked once.
- `job`: `tune(tasks, options, store, callbacks)`: tuners, one cost model per target, the task
  scheduler, the leaders confirmed at the end.
- `task_tuner`: `TaskTuner` (one task's search, measurer and `TuneResult`; a round = search a
  batch, measure it, learn).
- `scheduler`: which task's round runs next (round-robin, gradient).
- `measurer`: programs -> source -> build -> run -> results, handed on one by one.
- `callbacks`: the hooks of a job; `RecordToDatabase` commits each record as it comes.
- `transfer` and `dataset`: what a job starts from (earlier records as arrays, the pretrained
  model, another target's best programs; `retarget` fits those to this target's vectors).
- `quick`: a workload without records gets a model-ranked quick search before it is built.

The job draws nothing: progress displays are callbacks handed in by `ansor.api` or the CLI.
"""
