"""``sentinel verify --devices``, without a GPU: the GPU count, names and ``set_device`` are mocked. Usage errors
for every wrong list; workers pinned to GPUs give the rows of one process, and each GPU's share adds up; a record
made on four GPUs of one model is that model's record (same file), names every GPU, and joins only a saved record
of the same GPUs; the JSON report carries the shares."""
from __future__ import annotations

import json
from concurrent.futures import Future

import pytest
import torch

from kernel_sentinel import device, records, registry, workers
from kernel_sentinel.cli import main
from kernel_sentinel.rows import Options, verify_route

CPU = Options(device=torch.device("cpu"), seed=0, examples=2)
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def gpus(monkeypatch):
    """A host with two H100s as far as torch.cuda tells (nothing runs on them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda gpu=None: H100)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


@pytest.mark.parametrize("value, message", [
    ("cuda:9", "--devices lists cuda:9: this host has 2 GPUs (cuda:0 to cuda:1)"),
    ("cpu,cuda:0", "--devices lists the CPU: give all, or CUDA GPUs as cuda:N separated by commas"),
    ("cuda:1,cuda:1", "--devices lists cuda:1 twice"),
    ("1", "--devices lists '1': give all, or CUDA GPUs as cuda:N"),
    ("cuda:0,", "--devices lists '': give all"),
])
def test_wrong_device_lists_are_usage_errors(gpus, capsys, value, message):
    assert main(["verify", "--devices", value, "--device", "cuda", "--family", "sinkhorn"]) == 2
    assert message in capsys.readouterr().err


def test_devices_without_a_gpu_or_on_the_cpu_are_usage_errors(gpus, monkeypatch, capsys):
    assert main(["verify", "--devices", "all", "--device", "cpu", "--family", "sinkhorn"]) == 2
    assert "--devices spreads the run over CUDA GPUs: drop --device cpu" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["verify", "--devices", "all", "--family", "sinkhorn"]) == 2
    assert "--devices spreads the run over CUDA GPUs: no CUDA device is available" in capsys.readouterr().err


def test_select_gpus_reads_all_and_lists(gpus):
    cuda = torch.device("cuda")
    assert device.select_gpus("all", cuda) == (0, 1)
    assert device.select_gpus(" cuda:1 , cuda:0", cuda) == (1, 0)


def test_visible_id_follows_the_parents_renumbering(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert device.visible_id(1) == "1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert device.visible_id(1) == "6"


@pytest.mark.parametrize("jobs, gpus, units, want", [
    (1, (), 50, [None]),
    (3, (), 2, [None, None]),
    (1, (0, 1, 2, 3), 50, [0, 1, 2, 3]),  # one worker per GPU at least
    (6, (0, 1, 2, 3), 50, [0, 1, 2, 3] * 2),  # ceil(6 / 4) per GPU
    (8, (1, 3), 50, [1, 3] * 4),
    (8, (0, 1), 3, [0, 1, 0]),  # never more workers than units
    (1, (2,), 50, [2]),  # one GPU: this process, pinned
])
def test_slots_pin_the_same_count_of_workers_to_each_gpu(jobs, gpus, units, want):
    assert workers.slots(jobs, gpus, units) == want


class PinnedPool:
    """Stands in for the spawned pool of ``--devices``: as many workers as asked, each started with the
    initializer (which takes its GPU from the queue); units run in this process, handed to the workers in turn."""

    def __init__(self, jobs, mp_context=None, initializer=None, initargs=()):
        self.gpus = []
        for _ in range(jobs):
            initializer(*initargs)
            self.gpus.append(workers._gpu)
        self.turn = 0

    def submit(self, fn, *args):
        workers._gpu, self.turn = self.gpus[self.turn % len(self.gpus)], self.turn + 1
        future = Future()
        future.set_result(fn(*args))
        return future

    def shutdown(self, wait=True, cancel_futures=False):
        pass


def test_workers_pinned_to_gpus_give_the_rows_of_one_process_and_their_shares(monkeypatch, toy_family):
    family = toy_family(dtypes=(torch.float32, torch.float64))
    pinned = []
    monkeypatch.setattr(workers, "ProcessPoolExecutor", PinnedPool)
    monkeypatch.setattr(workers, "_pin", pinned.append)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr("kernel_sentinel.registry.family", lambda name: family)
    selected = [(family, route_id, dtype) for dtype in family.dtypes for route_id in ("toy.fast", "toy.slow")]
    slots = workers.slots(4, (0, 1), 100)
    shares = workers.shares(slots)
    got = workers.verify_in_processes(selected, CPU, slots, shares)
    assert got == [verify_route(family, route_id, CPU, dtype=dtype) for _, route_id, dtype in selected]
    assert sorted(pinned) == [0, 0, 1, 1]  # each worker made its GPU current as it started
    units = workers.unit_count(selected, CPU)
    assert units == 8 and [s.units for s in shares.values()] == [4, 4] and all(s.seconds > 0 for s in shares.values())
    assert [s.processes for s in shares.values()] == [2, 2]


def test_compute_sanitizer_jobs_take_the_workers_gpus(toy_family):
    family = toy_family()
    results = [verify_route(family, "toy.slow", CPU)] * 5
    slots = [0, 1]
    shares = workers.shares(slots)
    held: list[int] = []

    def sanitize(result, gpu):
        held.append(gpu)
        return result if len(held) == 3 else type(result)(result.id, result.family, result.checks[:1], result.dtype)

    done = workers.sanitize_on(results, sanitize, slots, shares)
    assert len(done) == 5 and done[2] is results[2] and len(done[0].checks) == 1
    assert sorted(set(held)) == [0, 1] and sum(s.sanitized for s in shares.values()) == 4


def test_a_record_on_four_gpus_is_the_models_record(gpus, monkeypatch, tmp_path, toy_family):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    info = device.info(torch.device("cuda"), (0, 1, 2, 3))
    assert info == {"type": "cuda", "name": H100, "gpus": [H100] * 4}
    one = device.info(torch.device("cuda"))
    assert one == {"type": "cuda", "name": H100, "gpus": [H100]}
    assert records.record_path("toy", info) == records.record_path("toy", one) == records.record_path(
        "toy", {"type": "cuda", "name": H100})  # a record written before "gpus": the same file
    assert records.device_text(info) == f"4 x {H100}" and records.device_text(one) == H100
    mixed = {"type": "cuda", "name": f"{H100} + NVIDIA H200", "gpus": [H100, "NVIDIA H200"]}
    assert records.device_text(mixed) == f"{H100} + NVIDIA H200 (2 GPUs)"
    assert records.gpus({"type": "cuda", "name": H100}) == [H100] and records.gpus({"type": "cpu", "name": "x"}) == []

    family = toy_family()
    monkeypatch.setattr(records, "record_dir", lambda: tmp_path)
    fast, slow = (verify_route(family, r, CPU) for r in ("toy.fast", "toy.slow"))
    order = [("toy.fast", "float32"), ("toy.slow", "float32")]
    records.save_record(records.make_record(family, info, [fast]))
    joined = records.merge_record(records.make_record(family, info, [slow]), order)
    assert [r["id"] for r in joined["routes"]] == ["toy.fast", "toy.slow"]  # the same four GPUs: one record
    alone = records.merge_record(records.make_record(family, one, [slow]), order)
    assert [r["id"] for r in alone["routes"]] == ["toy.slow"]  # one GPU: not joined with the four-GPU rows


def test_json_report_has_each_devices_share(tmp_path):
    report_path = tmp_path / "r.json"
    assert main(["verify", "--family", "sinkhorn", "--route", "sinkhorn.torch.log.infer", "--dtype", "float32",
                 "--device", "cpu", "--quick", "--jobs", "1", "--json", str(report_path)]) == 0
    data = json.loads(report_path.read_text())
    assert data["device"] == {"type": "cpu", "name": "CPU (Triton interpreter)"}
    (share,) = data["devices"]["shares"]
    family = registry.family("sinkhorn")
    properties = sum(p.runs_at("sinkhorn.torch.log.infer", torch.float32) for p in family.properties)
    assert share["device"] == "cpu" and share["processes"] == 1 and share["units"] == properties + 1  # + the rest
    assert data["devices"]["wall_seconds"] >= share["seconds"] > 0
    assert [c["name"] for c in data["routes"][0]["checks"]][-1] == "devices"
    assert data["routes"][0]["checks"][-1]["detail"] == "not applicable: a CPU run (no second device)"
