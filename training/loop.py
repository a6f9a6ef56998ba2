"""The one training loop: ``train(cfg) -> summary dict`` (TRM, HRM, transformer and ETRM all use it).

Reading order: ``train`` -> ``Trainer.__init__`` (components from ``training.build``, the run directory from
``training.rundir``, resume through ``training.state``) -> ``Trainer.run`` (the step loop) ->
``Trainer.train_step`` (one optimizer update). See docs/training.md for the semantics of every metric, the
ACT-carry data consumption and the resume guarantees.
"""

from __future__ import annotations

import math
import os
from typing import Any, Optional, Union

import torch

from core.nn import compile_module
from training import build
from training import checkpoint as ckpt
from training import distributed as D
from training import summary as S
from training.config import ConfigError, PretrainConfig, config_from_dict, config_from_hydra
from training.ema import EMA
from training.eval_hook import eval_is_due, run_eval
from training.health import HealthConfig, HealthMonitor
from training.metrics import reduce_window
from training.optim import apply_update, describe_optimizers, global_grad_norm
from training.report import CONFIG_FILE, RunReport
from training.rundir import RunDir, run_dir, run_identity, with_identity
from training.schedule import lr_of, schedulers_of
from training.signals import StopSignals
from training.state import CheckpointManager, Progress, RunRecord, check_checkpoint_data, training_components

LR_POINTS = 100  # train/lr is logged at least this often over a run (besides every log window)


class NonFiniteLossError(RuntimeError):
    """The loss was not finite: the run stops and its last good checkpoint is kept."""


class Trainer:
    """Holds the state of one run. ``run()`` returns the summary dict."""

    def __init__(self, cfg: PretrainConfig, info: D.DistInfo):
        self.cfg, self.info, self.device = cfg, info, info.device
        self.local_bs = D.local_batch_size(cfg.global_batch_size, info.world_size)
        if cfg.resume and cfg.run_name is None and cfg.checkpoint_path is None:
            raise ConfigError("resume=true needs +run_name=… or checkpoint_path=… to find the run")
        self.project_name, self.run_name, group = D.broadcast_object(run_identity(cfg))  # stored with the config:
        self.cfg = cfg = with_identity(cfg, self.project_name, self.run_name, group)  # a resume reads its names
        self.checkpoint_dir = run_dir(cfg, self.project_name, self.run_name)
        self.rundir = RunDir(self.checkpoint_dir, info, resume=cfg.resume, warn=self._print)
        self.rundir.claim()
        try:
            self._build()
        except BaseException:
            self.close()
            self.rundir.discard_if_empty()
            raise

    def _build(self) -> None:
        """Data, model, optimizers, EMA, resume (the body of ``__init__`` once the run directory is ours)."""
        cfg, info = self.cfg, self.info
        D.seed_everything(cfg.seed, 0)  # identical on every rank for construction (same initial weights)
        self.data = build.build_run_data(cfg, info, os.path.join(self.checkpoint_dir, "eval"), say=self._print)
        self.model = build.build_act_model(cfg, self.data.metadata, self.local_bs).to(self.device)
        self.rule_table = build.build_rule_table(cfg, self.device, say=self._print)  # rule readout labels, or None
        self.arch = build.resolve_arch(cfg)
        self.head = build.build_loss_head(self.model, cfg.loss_type).to(self.device)
        self.optimizers = build.build_optimizers(cfg, self.model, info.world_size)
        self.schedulers = schedulers_of(cfg, self.optimizers, lambda: self.total_steps)
        self.trainable, self.encoder_params, self.inner_params = build.split_params(self.model)
        self.num_params = sum(p.numel() for p in self.trainable)
        D.broadcast_module_(self.model)  # guarantee identical replicas (no-op in one process)
        D.seed_everything(cfg.seed, info.rank)  # per-rank randomness (ACT exploration, dropout)
        self.progress = Progress()
        self.summary = S.RunSummary(
            self.checkpoint_dir,
            run_name=self.run_name,
            project_name=self.project_name,
            config_path=os.path.join(self.checkpoint_dir, CONFIG_FILE),
            total_steps=self.total_steps,
            num_params=self.num_params,
            warnings=self.data.warnings,
        )
        monitored = cfg.encoder is not None or cfg.early_stop or cfg.health != HealthConfig()
        self.health = HealthMonitor(cfg.health) if monitored else None
        self.report = RunReport(cfg, info, self.summary, self.health)
        # weights-only init unless the run resumes its own checkpoint (resume=true with none yet = a fresh run)
        if cfg.load_checkpoint and not (cfg.resume and ckpt.list_checkpoints(self.checkpoint_dir)):
            st = ckpt.load_weights(self.model, cfg.load_checkpoint, arch=self.arch)
            check_checkpoint_data(st, self.data.metadata, cfg.data_paths[0])
            self._print(f"[train] initialised weights from {st['_path']}")
        self.ema = EMA(self.model, cfg.ema_rate) if cfg.ema else None
        fp = self.data.train_dataset.fingerprint()
        record = RunRecord(cfg, self.arch, self.data.metadata, fp, self.local_bs, self.run_name, self.project_name)
        self.checkpoints = CheckpointManager(
            self.checkpoint_dir,
            info,
            record,
            training_components(
                self.model, self.ema, self.optimizers, self.schedulers, self.health, self.progress, say=self._print
            ),
            per_rank={"data_state": self.data.train_dataset},
            summary=self.summary,
            epochs_done=self._epochs_completed,
        )
        self._pending_rng: Optional[dict] = None
        if cfg.resume:
            state = self.checkpoints.load_latest()
            if state is None:
                self._print(f"[train] resume=true but no checkpoint in {self.checkpoint_dir}; starting fresh")
            else:
                self._pending_rng = self.checkpoints.restore(state, self.progress, self._print)
        # compile the loss head (model inside); diagnostics / EMA stay outside (pitfall 18)
        self.compiled = D.should_compile(cfg.compile, self.device)
        self.forward = compile_module(self.head, dynamic=False) if self.compiled else self.head
        self._diag_fn = getattr(self.model, "diagnostics", None)
        self.stop = StopSignals(verbose=info.is_main)
        self._pending_save = False
        self._last_outputs: dict = {}

    # -- bookkeeping ------------------------------------------------------------------------------------
    step = property(lambda self: self.progress.step, lambda self, v: setattr(self.progress, "step", v))
    carry = property(lambda self: self.progress.carry)
    total_steps = property(lambda self: self.data.total_steps)
    batches_per_epoch = property(lambda self: self.data.batches_per_epoch)
    passes_per_epoch = property(lambda self: self.data.passes_per_epoch)

    def _print(self, msg: str) -> None:
        if self.info.is_main:
            print(msg, flush=True)

    def close(self) -> None:
        """Release the run directory's lock (idempotent; also called at the end of ``run``)."""
        self.rundir.release()

    def save_checkpoint(self) -> Optional[str]:
        return self.checkpoints.save(self.progress)

    def _epochs_completed(self) -> float:
        st = self.data.train_dataset.state_dict()
        loader_epochs = st.get("epoch", 0) + st.get("batch", 0) / max(1, self.batches_per_epoch)
        return round(loader_epochs * self.passes_per_epoch, 4)  # passes over the training groups

    def _lr(self, step: int, base_lr: float) -> float:
        return lr_of(self.cfg, step, base_lr, self.total_steps)

    # -- one optimizer update -----------------------------------------------------------------------------
    def train_step(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """One optimizer update on one global batch. Returns the rank-summed raw metric sums (host floats: the
        step's only device-to-host transfer)."""
        cfg, p = self.cfg, self.progress
        batch = build.with_rule_targets(batch, self.rule_table)  # they travel with the sample in the ACT carry
        if p.carry is None:
            with torch.device(self.device):
                p.carry = self.model.initial_carry(batch)
        # slots that halted at the previous step take this batch's data: the examples trained on (pitfall 21)
        new_examples = p.carry.halted.sum().float()
        with D.autocast(self.device):
            keys = self._return_keys()
            p.carry, loss, metrics, outputs, _ = self.forward(carry=p.carry, batch=batch, return_keys=keys)
        (loss / cfg.global_batch_size).backward()
        sums = {k: v.detach().float() for k, v in metrics.items()}
        sums["loss"] = loss.detach().float()
        sums["new_examples"] = new_examples
        sums["_stop"] = torch.tensor(1.0 if self.stop.requested else 0.0, device=loss.device)  # any rank -> all
        sums = D.all_reduce_dict_(sums)
        # gradients summed over ranks (loss already / global batch) -> norms BEFORE clipping (pitfall 4)
        D.all_reduce_grads_(self.trainable)
        total_norm = global_grad_norm(self.trainable, self.device)
        sums["grad/total_norm"] = total_norm
        if self.encoder_params:
            sums["grad/encoder_norm"] = global_grad_norm(self.encoder_params, self.device)
            sums["grad/inner_norm"] = global_grad_norm(self.inner_params, self.device)
        # one transfer of every scalar; the finiteness check comes before anything is applied to the weights
        host = dict(zip(sums, torch.stack([v.float().reshape(()) for v in sums.values()]).tolist()))
        if not math.isfinite(host["loss"]):
            for t in self.trainable:
                t.grad = None
            raise NonFiniteLossError(
                f"non-finite loss at step {p.step + 1}: loss={host['loss']} "
                f"(sum over the global batch); weights of step {p.step} kept"
            )
        frozen = p.step < cfg.freeze_decoder_steps
        apply_update(
            self.optimizers,
            self.trainable,
            self.inner_params,
            frozen=frozen,
            total_norm=total_norm,
            grad_clip=cfg.grad_clip,
            schedulers=self.schedulers,
        )
        if self.ema is not None:
            self.ema.update(self.model)
        p.step += 1
        p.examples_seen += int(host["new_examples"])
        host["train/decoder_frozen"] = float(frozen)
        self._last_outputs = outputs
        return host

    def _return_keys(self) -> tuple:
        """Outputs the loss head must return for ``model.diagnostics`` (ETRM: ``ETRM.DIAGNOSTIC_KEYS``)."""
        return tuple(getattr(self.model, "DIAGNOSTIC_KEYS", ())) if self._diag_fn is not None else ()

    # -- metrics and evaluation -------------------------------------------------------------------------
    def reduce_window(self, acc: dict[str, float], n_steps: int) -> dict[str, float]:
        """The logged values of a log window (training.metrics.reduce_window) + lr, examples seen, epoch."""
        out = reduce_window(
            acc, n_steps, global_batch_size=self.cfg.global_batch_size, extra_loss_keys=self.head.per_sample_keys
        )
        out["train/lr"] = self._lr(self.step, self.cfg.lr)
        out["train/examples_seen"] = float(self.progress.examples_seen)
        out["train/epoch"] = self._epochs_completed()
        return out

    def evaluate(self) -> dict[str, float]:
        """The eval hook (training.eval_hook.run_eval: EMA weights when ema=true; pitfall 14: raises)."""
        return run_eval(self.cfg, self.data, self.model, self.ema, self.info, self.step, self.checkpoint_dir)

    def _eval_due(self) -> bool:
        return eval_is_due(self.cfg, self.data, self.step)

    # -- the run ------------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train to the end (or a stop) and return the summary dict; the run directory is released at exit."""
        try:
            return self._run()
        finally:
            self.rundir.release()

    def _progress(self) -> dict[str, Any]:
        return dict(
            steps=self.step, examples_seen=self.progress.examples_seen, epochs_completed=self._epochs_completed()
        )

    def _open_report(self) -> None:
        line = (
            f"[train] run {self.project_name}/{self.run_name}: {self.num_params:,} params, {self.total_steps} steps "
            f"({self.batches_per_epoch} batches/epoch), world size {self.info.world_size}, device {self.device}, "
            f"compile={self.compiled}, {describe_optimizers(self.optimizers.values())}, checkpoints in "
            f"{self.checkpoint_dir}"
        )
        self.progress.wandb_id = self.report.open(step=self.step, resume_id=self.progress.wandb_id, start_line=line)

    def _run(self) -> dict[str, Any]:
        self._open_report()
        # Starting a DataLoader iteration draws its base seed from the global torch RNG: start it (fetch the
        # first batch) BEFORE restoring the checkpoint's RNG state, so a resumed run sees the same RNG stream.
        it = iter(self.data.train_loader)
        aborted = False  # a hard abort (second Ctrl-C): the in-memory state may be mid-step, never checkpoint it
        with self.stop:
            try:  # the first batch inside: its failure must not leave summary.json "running"
                first = next(it) if self.step < self.total_steps else None
                if self._pending_rng is not None:
                    ckpt.set_rng_state(self._pending_rng)  # the very last thing before the first step (exact resume)
                    self._pending_rng = None
                stop_reason, exit_status, message = self._loop(it, first)
            except NonFiniteLossError as e:
                stop_reason, exit_status, message = S.STOP_NONFINITE, S.EXIT_NONFINITE, str(e)
                self._print(f"[train] STOP: {e}; the last good checkpoint is left intact")
            except KeyboardInterrupt:  # second Ctrl-C (or no handler): possibly mid-step, so no final checkpoint
                aborted, stop_reason, exit_status = True, S.STOP_INTERRUPTED, S.EXIT_INTERRUPTED
                last = ckpt.find_latest_checkpoint(self.checkpoint_dir)
                message = (
                    f"KeyboardInterrupt: aborted without a final checkpoint; resume=true continues from "
                    f"{os.path.basename(last) if last else 'the start (no checkpoint yet)'}"
                )
                self._print(f"[train] {message}")
            except BaseException as e:  # evaluator failure, data error, ...: record it, close W&B, re-raise
                self.report.fail(e, steps=self.step, examples_seen=self.progress.examples_seen)
                raise
            finally:
                build.stop_iterator(it)
            return self._finish(stop_reason, exit_status, message, aborted)

    def _loop(self, it: Any, first: Any) -> tuple[str, int, Optional[str]]:
        """The step loop -> (stop_reason, exit_status, message)."""
        p = self.progress
        while self.step < self.total_steps:
            item, first = (first, None) if first is not None else (next(it), None)
            batch = {k: v.to(self.device, non_blocking=True) for k, v in item[1].items()}
            sums = self.train_step(batch)
            stop_requested = sums.pop("_stop") > 0
            for k, v in sums.items():
                p.window[k] = p.window.get(k, 0.0) + v
            p.window_steps += 1
            self.report.logger.advance()
            logs = self._step_logs()
            if logs and (early := self.report.publish(self.step, logs, **self._progress())):
                return f"early_stop: {early}", S.EXIT_EARLY_STOP, None
            if (self.cfg.checkpoint_every and self.step % self.cfg.checkpoint_every == 0) or self._pending_save:
                self._pending_save = False
                if self.step != self.total_steps:
                    self.save_checkpoint()
            if stop_requested:
                return S.STOP_INTERRUPTED, S.EXIT_INTERRUPTED, self.stop.requested or "stop"
        return (S.STOP_MAX_STEPS if self.data.capped else S.STOP_COMPLETED), S.EXIT_OK, None

    def _step_logs(self) -> dict[str, float]:
        """What this step logs: the closed log window, the diagnostics, a scheduled evaluation."""
        cfg, p, logs = self.cfg, self.progress, {}
        if self.step % cfg.log_interval == 0 or self.step == self.total_steps:
            logs.update(self.reduce_window(p.window, p.window_steps))
            p.window, p.window_steps = {}, 0
        elif self.step % max(1, self.total_steps // LR_POINTS) == 0:  # the schedule's shape, between windows
            logs["train/lr"] = self._lr(self.step, cfg.lr)
        if self._diag_fn is not None and self.step % cfg.diag_interval == 0:
            with torch.no_grad():
                d = self._diag_fn(self._last_outputs) or {}
            logs.update({(k if "/" in k else f"diag/{k}"): float(v) for k, v in d.items()})
        if self._eval_due() and self.step != self.total_steps:
            ev = self.evaluate()
            self.report.eval_result(self.step, ev, log=False)
            logs.update(ev)
            self._pending_save = self._pending_save or cfg.checkpoint_every_eval
        return logs

    def _finish(self, stop_reason: str, exit_status: int, message: Optional[str], aborted: bool) -> dict[str, Any]:
        """End of run: final eval, final checkpoint, summary; W&B closed with the exit status."""
        try:
            ended = exit_status in (S.EXIT_OK, S.EXIT_EARLY_STOP)
            if ended and self.cfg.eval_at_end and self.data.test_loader is not None:
                self.report.eval_result(self.step, self.evaluate(), log=True)
            # max_steps=0: the initial weights are the run's one checkpoint (step_0; a from-scratch start for TTT)
            if exit_status != S.EXIT_NONFINITE and (self.step > 0 or self.total_steps == 0) and not aborted:
                self.save_checkpoint()
            return D.broadcast_object(
                self.report.finish(stop_reason, exit_status, message, self.checkpoint_dir, **self._progress())
            )
        except BaseException as e:
            if exit_status == S.EXIT_OK:
                self.report.fail(e, steps=self.step, examples_seen=self.progress.examples_seen)
            raise
        finally:
            self.report.close(exit_status)


def train(cfg: Union[PretrainConfig, dict, Any]) -> dict[str, Any]:
    """Validate ``cfg`` (PretrainConfig, dict or Hydra DictConfig), train, and return the summary dict.

    The summary's ``exit_status`` is 0 (completed / max_steps), 2 (non-finite loss), 3 (early stop) or 130
    (interrupted); ``pretrain.py`` exits with it.
    """
    if not isinstance(cfg, PretrainConfig):
        cfg = config_from_dict(cfg) if isinstance(cfg, dict) else config_from_hydra(cfg)
    with D.process_group(cfg.device) as info:
        return Trainer(cfg, info).run()
