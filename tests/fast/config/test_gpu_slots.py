"""Several fine-tunes per GPU (training.jobs_per_gpu, issue 46): the slot claim of `istar launch` on a
pretended GPU count (its lock files need no GPU), the slot arithmetic the workflow and the launcher
share, and the memory check that refuses a share that cannot fit."""

import threading
import time
from collections import Counter

import pytest
import torch

from istar.config.gpu_slots import gpu_budget, gpu_units, granted_gpus_of
from istar.steps.gpu_memory import GIB, claim_gpu_share, memory_bytes, share_problem
from istar.steps.launch import claim_gpus, try_claim, visible_devices


TWO = ["0", "1"]  # two pretended GPUs, as CUDA_VISIBLE_DEVICES names them


def test_slot_jobs_spread_over_the_gpus_and_whole_gpus_wait_for_every_slot(tmp_path):
    k = 2
    first = try_claim(tmp_path, 1, TWO, k)
    assert (first.gpus, first.slot) == (["0"], 0)
    second = try_claim(tmp_path, 1, TWO, k)
    assert (second.gpus, second.slot) == (["1"], 0)  # the least-loaded GPU: GPU 1 does not idle
    third = try_claim(tmp_path, 1, TWO, k)
    assert (third.gpus, third.slot) == (["0"], 1)
    assert try_claim(tmp_path, 1, TWO, 1) is None  # a whole GPU: none is free of slot holders
    fourth = try_claim(tmp_path, 1, TWO, k)
    assert (fourth.gpus, fourth.slot) == (["1"], 1)
    assert try_claim(tmp_path, 1, TWO, k) is None  # 2 GPUs × K = 2: every slot is taken
    first.release()
    again = try_claim(tmp_path, 1, TWO, k)
    assert (again.gpus, again.slot) == (["0"], 0)
    for claim in (again, third, fourth):
        claim.release()
    assert try_claim(tmp_path, 2, TWO, k) is None  # GPU 1 still has a slot holder: nothing is taken
    second.release()
    whole = try_claim(tmp_path, 2, TWO, k)
    assert (whole.gpus, whole.slot) == (TWO, None)
    assert try_claim(tmp_path, 1, TWO, k) is None  # no slot on a GPU a whole-GPU job holds
    whole.release()


def test_four_jobs_with_k_4_on_two_gpus_run_two_per_gpu(tmp_path):
    claims = [try_claim(tmp_path, 1, TWO, 4) for _ in range(4)]
    assert Counter(claim.gpus[0] for claim in claims) == {"0": 2, "1": 2}
    for claim in claims:
        claim.release()


def test_a_preset_cuda_visible_devices_is_shared_out_among_jobs(tmp_path):
    """CUDA_VISIBLE_DEVICES=1,3 (salloc, or the user's own export): jobs claim its entries, each sees its own."""
    devices = visible_devices({"CUDA_VISIBLE_DEVICES": "1,3"})
    assert devices == ["1", "3"]
    one, other = (try_claim(tmp_path, 1, devices, 2) for _ in range(2))
    assert (one.gpus, other.gpus) == (["1"], ["3"])
    whole = try_claim(tmp_path, 1, ["3", "5"], 1)
    assert whole.gpus == ["5"]  # GPU 3 has a slot holder
    for claim in (one, other, whole):
        claim.release()


def test_mixed_one_and_two_gpu_jobs_never_exceed_k_per_gpu_and_all_finish(tmp_path):
    """24 jobs on 2 pretended GPUs with K = 3: slot jobs and 2-GPU jobs, each claiming as `istar launch` does
    and holding its GPUs a moment; at no time more than K jobs on a GPU or a slot job beside a whole-GPU job,
    and every job finishes (all-or-nothing claims cannot deadlock)."""
    k, total, lock = 3, 2, threading.Lock()
    holders = {gpu: Counter() for gpu in range(total)}
    peaks, errors = Counter(), []

    def job(count: int) -> None:
        try:
            with claim_gpus(count, [str(gpu) for gpu in range(total)], tmp_path, poll_seconds=0.002, jobs_per_gpu=k) as gpus:
                kind = "slot" if count == 1 else "whole"
                with lock:
                    for gpu in gpus:
                        holders[int(gpu)][kind] += 1
                        assert holders[int(gpu)]["slot"] <= k and holders[int(gpu)]["whole"] <= 1
                        assert not (holders[int(gpu)]["slot"] and holders[int(gpu)]["whole"])
                        peaks[gpu] = max(peaks[gpu], holders[int(gpu)]["slot"])
                time.sleep(0.01)
                with lock:
                    for gpu in gpus:
                        holders[int(gpu)][kind] -= 1
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=job, args=(2 if i % 4 == 0 else 1,), daemon=True) for i in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not [thread for thread in threads if thread.is_alive()], "claims deadlocked"
    assert not errors, errors
    assert max(peaks.values()) > 1  # the GPUs were shared


def test_the_gpu_resource_counts_slots_and_the_launcher_reads_them_back():
    assert [gpu_units(g, 4) for g in (0, 1, 2, 3)] == [0, 1, 8, 12]  # one slot; whole GPUs for more
    assert [gpu_units(g, 1) for g in (0, 1, 2)] == [0, 1, 2]
    assert gpu_budget(2, 4) == 8 and gpu_budget(None, 4) is None
    for gpus in (0, 1, 2, 3):
        assert granted_gpus_of(gpu_units(gpus, 4), 4) == (gpus, gpus == 1)
    assert granted_gpus_of(2, 1) == (2, False)
    with pytest.raises(ValueError, match="multiple of training.jobs_per_gpu = 4"):
        granted_gpus_of(6, 4)


def test_a_share_that_does_not_fit_is_refused_before_any_step_naming_k_and_the_estimate():
    minilm = memory_bytes(22_713_216, 384, 6, 12, batch=32, tokens=128)
    bert_base = memory_bytes(109_483_778, 768, 12, 12, batch=32, tokens=128)
    assert 1.0 * GIB < minilm < 2.0 * GIB and 3.0 * GIB < bert_base < 5.0 * GIB
    assert memory_bytes(1, 384, 6, 12, 32, 128, activation_bytes=4) > memory_bytes(1, 384, 6, 12, 32, 128)
    assert memory_bytes(109_483_778, 768, 12, 12, 128, 128, trains=False) < bert_base  # forward only, 4× the batch
    h100 = 80 * GIB
    assert share_problem(8, bert_base, h100, h100, "an H100") is None  # 8 BERT-base fine-tunes: 10 GiB each
    assert share_problem(8, bert_base, 16 * GIB, 16 * GIB, "a 16 GiB GPU") == (
        f"training.jobs_per_gpu = 8: each job's share of a 16 GiB GPU is 2.0 GiB of its 16.0 GiB, and one needs about "
        f"{bert_base / GIB:.1f} GiB (estimated); set training.jobs_per_gpu to 4 or less, or lower training.batch_size")
    # its share fits, but another process holds most of the card now
    held = share_problem(8, bert_base, 3 * GIB, h100, "an H100")
    assert held.startswith("an H100 has 3.0 GiB free of its 80.0 GiB") and "lower training.jobs_per_gpu" in held


def test_a_run_on_the_cpu_is_not_held_to_a_gpu_share(monkeypatch, tiny_bert):
    from istar.registry.precisions import PRECISIONS

    monkeypatch.setenv("ISTAR_JOBS_PER_GPU", "64")
    claim_gpu_share(tiny_bert, 32, 128, PRECISIONS["fp16"], torch.device("cpu"))


def test_replicas_as_micro_batches_ask_for_one_gpu_and_accumulate_every_replicas_batch():
    from istar.config.gpu_slots import fine_tune_gpus, micro_batches_per_step
    from istar.pipeline.validate import validate_config

    ddp = {"gpus": 2, "gradient_accumulation_steps": 2, "replicas_as_micro_batches": False}
    one = {**ddp, "replicas_as_micro_batches": True}
    assert (fine_tune_gpus(ddp), micro_batches_per_step(ddp)) == (2, 2)
    assert (fine_tune_gpus(one), micro_batches_per_step(one)) == (1, 4)
    cpu = {**one, "gpus": 0}
    assert (fine_tune_gpus(cpu), micro_batches_per_step(cpu)) == (0, 2)
    with pytest.raises(Exception, match=r"replicas_as_micro_batches': .* set replicas_as_micro_batches to false, or "
                                        r"global_penalty to false"):
        validate_config({"training": one, "penalty": {"global_penalty": True}}, check_paths=False)


def test_threads_are_lowered_so_every_slot_can_run_or_refused_with_the_numbers():
    from istar.config.gpu_slots import packed_threads

    assert packed_threads(8, 32, 6) == 5 and packed_threads(2, 32, 6) == 2 and packed_threads(8, 6, 6) == 1
    with pytest.raises(ValueError, match=r"^--cores 4 runs at most 4 jobs at once, fewer than the 6 GPU slots .* "
                                         r"give --cores 6 or more"):
        packed_threads(8, 4, 6)
