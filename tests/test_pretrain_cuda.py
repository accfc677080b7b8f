"""The pretrained CUDA cost model: trained on the records of a lent H100 (committed under
benchmarks/results), shipped beside the CPU one, loaded by CUDA jobs only, and better than an
untrained model at ranking the programs of a workload left out of its training."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ansor import Target
from ansor.costmodel.metrics import NOISE_MARGIN, pairwise_accuracy
from ansor.costmodel.model import XGBModel, normalized_throughputs
from ansor.costmodel.pretrained import load_pretrained, model_file, provenance
from ansor.pretrain.corpus import load_corpus, usable_programs
from ansor.pretrain.train import fit, train
from ansor.store import open_store
from ansor.tuning.transfer import shared_cost_model
from ansor.workloads import make_task

RECORDS = Path(__file__).parents[1] / "benchmarks" / "results" / "gpu_h100_2026-11-27"
RECORD_FILES = ("gpu_records.jsonl", "gpu_h100_tensorcore_records.jsonl")
FP16_GEMM = "wk1-c21209db486c5c86f7985cbc8f5ed49c"   # float16 Tensor Core GEMM 4096^3
SGEMM = "wk1-f07b4b44c0ff65a5ba9cae995bc3eeb6"       # float32 GEMM 4096^3 (both sketches)


def _trees(model: XGBModel) -> int:
    return model.base.num_boosted_rounds()


def test_a_cuda_job_starts_from_the_cuda_model_and_a_cpu_job_from_the_cpu_one():
    info = provenance("cuda")
    assert info is not None and info["target"] == "cuda-sm_90" and "H100" in info["machine"]
    assert {r["file"]: r["records"] for r in info["record_files"]} == {
        RECORD_FILES[0]: 516, RECORD_FILES[1]: 800, "r18_half_records.jsonl": 131,  # + a half ResNet-18's tasks
        "gpu_h200_tensorcore_records.jsonl": 421, "gpu_h200_records_template_unmeasured.jsonl": 399}  # + wgmma
    assert model_file("cuda").stat().st_size < 2_000_000
    with open_store(":memory:")[0] as store:
        cuda = shared_cost_model([make_task("matmul", (256, 256, 256), target=Target.cuda("sm_90"))],
                                 store, seed=0, transfer_programs=0, pretrained=True)
        cpu = shared_cost_model([make_task("matmul", (64, 64, 64))], store, seed=0, transfer_programs=0,
                                pretrained=True)
        off = shared_cost_model([make_task("matmul", (256, 256, 256), target=Target.cuda("sm_80"))],
                                store, seed=0, transfer_programs=0, pretrained=False)
    assert cuda.pretrained and cuda.trusted
    assert _trees(cuda) == info["rounds"]
    assert _trees(cuda) == _trees(load_pretrained(Target.cuda("sm_80")))
    assert cpu.pretrained and _trees(cpu) == provenance("cpu")["rounds"] != _trees(cuda)
    assert not off.pretrained


@pytest.fixture(scope="module")
def gpu_corpus():
    store, _ = open_store(":memory:")
    with store:
        for name in RECORD_FILES:
            store.import_jsonl(RECORDS / name)
        data, target = load_corpus([store], "cuda-sm_90")
        yield store, data, target


def test_held_out_gemm_ranked_better_than_by_an_untrained_model(gpu_corpus):
    """Trained on the float32 GEMM's programs alone, the model ranks the float16 Tensor Core
    GEMM's (another dtype, instruction and program family) well above chance, where a job's
    model before its first fit ranks at random."""
    _, data, target = gpu_corpus
    assert target == "cuda-sm_90"
    usable = usable_programs(data)
    train_idx = [i for i, g in enumerate(data.groups) if g == SGEMM and usable[i]]
    test_idx = [i for i, g in enumerate(data.groups) if g == FP16_GEMM and usable[i]]
    assert len(train_idx) > 500 and len(test_idx) > 200
    truth = normalized_throughputs(data.costs, data.groups)[test_idx]
    features = [data.features[i] for i in test_idx]
    trained = fit(data, train_idx, seed=0).predict(features)
    untrained = XGBModel(seed=0).predict(features)
    trained_acc = pairwise_accuracy(trained, truth, margin=NOISE_MARGIN)
    untrained_acc = pairwise_accuracy(untrained, truth, margin=NOISE_MARGIN)
    assert trained_acc > 0.65, trained_acc
    assert abs(untrained_acc - 0.5) < 0.05, untrained_acc
    assert trained_acc > untrained_acc + 0.1


def test_training_from_record_files_writes_a_cuda_provenance(gpu_corpus, tmp_path):
    store, data, _ = gpu_corpus
    out = tmp_path / "cuda.model.json"
    model, info = train([store], "cuda-sm_90", folds=2, seed=0, output=str(out),
                        device="NVIDIA H100 80GB HBM3", record_files=[("a.jsonl", 516)], log=lambda line: None)
    scores = info["held_out_scores"]
    assert {row["workload"] for row in scores["workloads"]} == {SGEMM, FP16_GEMM}
    assert scores["pretrained"]["pairwise_accuracy"] > scores["untrained"]["pairwise_accuracy"] + 0.1
    assert info["machine"] == "NVIDIA H100 80GB HBM3" and info["record_files"] == [{"file": "a.jsonl", "records": 516}]
    reloaded = XGBModel.load(out)
    probe = data.features[:8]
    assert np.allclose(reloaded.predict(probe), model.predict(probe))
