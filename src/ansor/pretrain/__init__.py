"""Training the cost model that ships with the package (`ansor/costmodel/pretrained/`).

The shipped model is part of the product: a workload nobody has tuned is ranked by it, and every
tuning job's model continues from it. Building it is three steps, each resumable or repeatable
on another machine:

- `corpus`: which workloads the model learns from (the fused subgraphs of reference models
  and operators of every named workload family at random shapes, never the suite's own
  shapes) and the records of a corpus read back as one data set; `models`: those reference
  models.
- `collect`: tune every corpus workload into a database, topping up what a run left missing.
- `train`: score how a model trained on some workloads ranks the programs of the others,
  train on everything, and write the model with its provenance (into the package, or a file).
- `score`: how model files rank the records of workloads outside every corpus.

`command` is the `ansor pretrain collect|train|score` command line over them.
"""
