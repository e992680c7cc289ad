"""Checkpoints: model + optimizer through torch.distributed.checkpoint (sharded, reshardable), the
rest of the run's state (step, LR schedule, loss scaler, clipper history, loader position, RNG) as
one JSON file written last — a directory without it is incomplete and ignored.

RUN_DIR/checkpoints/step_00000040/{__0_0.distcp, .metadata, trainer_state.json}
"""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import warnings
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step_(\d{8})$")


def rng_state() -> dict[str, Any]:
    state = {"torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii")}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = base64.b64encode(torch.cuda.get_rng_state().numpy().tobytes()).decode("ascii")
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["cuda"])), dtype=torch.uint8))


class GlobalRng:
    """torch's global generators (CPU, and CUDA when in use) as a checkpointable part of the trainer."""

    def state_dict(self) -> dict[str, Any]:
        return rng_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_rng_state(state)


class Checkpointer:
    def __init__(self, directory: str, keep: int, layout):
        self.directory, self.keep, self.layout = directory, max(1, keep), layout
        if layout.writes_metrics:
            os.makedirs(directory, mode=0o755, exist_ok=True)
        layout.barrier()

    def complete_steps(self) -> list[int]:
        if not os.path.isdir(self.directory):
            return []
        steps = []
        for name in os.listdir(self.directory):
            match = _STEP_DIR.match(name)
            if match and os.path.isfile(os.path.join(self.directory, name, STATE_FILE)):
                steps.append(int(match.group(1)))
        return sorted(steps)

    def latest(self) -> int | None:
        steps = self.complete_steps()
        return steps[-1] if steps else None

    def path(self, step: int) -> str:
        return os.path.join(self.directory, f"step_{step:08d}")

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> str:
        final = self.path(step)
        tmp = os.path.join(self.directory, f".tmp_step_{step:08d}")
        if self.layout.writes_metrics:
            shutil.rmtree(tmp, ignore_errors=True)
        self.layout.barrier()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        optim_sd = self.layout.optimizer_state_to_save(optim_sd)
        with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
            warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp)
        self.layout.barrier()
        names = self.layout.names_on_any_rank(_params_with_state(model, optimizer))
        if self.layout.writes_metrics:
            state = dict(state, optimizer_state_keys=names)
            with open(os.path.join(tmp, STATE_FILE + ".part"), "w") as fh:
                json.dump(state, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(os.path.join(tmp, STATE_FILE + ".part"), os.path.join(tmp, STATE_FILE))
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            for old in self.complete_steps()[:-self.keep]:
                shutil.rmtree(self.path(old), ignore_errors=True)
        self.layout.barrier()
        return final

    def load(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        path = self.path(step)
        with open(os.path.join(path, STATE_FILE)) as fh:
            state = json.load(fh)
        # get_state_dict gives every parameter optimizer state (a zero-lr step) so DCP has a target
        # for each saved tensor; parameters that had no state when saved (frozen, never stepped) may
        # be absent from the checkpoint, and their state is dropped again after loading.
        model_sd, optim_sd = get_state_dict(model, optimizer)
        target = {"model": model_sd, "optim": optim_sd}
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
            dcp.load(target, checkpoint_id=path, planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
        set_state_dict(model, optimizer, model_state_dict=target["model"], optim_state_dict=target["optim"])
        keep = set(state.get("optimizer_state_keys", []))
        keep = self.layout.after_checkpoint_load(model, optimizer, keep)
        for name, param in _named_parameters(model):
            if name not in keep:
                optimizer.state.pop(param, None)
        return state


def _named_parameters(model: torch.nn.Module):
    seen = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        name = name.removeprefix("module.").replace("_orig_mod.", "")
        if id(param) in seen:
            continue
        seen.add(id(param))
        yield name, param


def _params_with_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    return [name for name, param in _named_parameters(model) if optimizer.state.get(param)]
