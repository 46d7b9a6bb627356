"""
A run's folder (--out_dir) and what is written into it, kept out of train_rm.py's loop: the
claim (a run never replaces another by accident, nor a file nanoRM did not write, and holds a
lock while it runs), the log rows of log.jsonl and the loggers beside it (TensorBoard, W&B), and
the pictures.

    with claimed(cfg, proc): ...       # check_out_dir, claim, the record of its files, release
    check_out_dir(cfg, proc)           # refuse a folder holding a run unless --resume/--overwrite
    lock = claim(out_dir)              # out_dir/.lock: one run at a time; release(lock) at the end
    start_log(path, keep_until=step)   # a resumed run keeps the log rows its checkpoint holds
    loggers = open_loggers(log_dir, use_wandb, config, master); append_row(path, row)

A first reading can skip this file.
"""

import fcntl
import json
import os
import re
import socket
import stat
import zipfile
from contextlib import contextmanager
from dataclasses import asdict, is_dataclass

import torch.distributed as dist
from matplotlib.figure import Figure

from nanorm.base.checkpoints import load
from nanorm.base.command import MARKER, Outputs, UsageError, append_text, atomic_write, disk_error
from reward import accuracy

# ----------------------------------------------------------------------------- the claim
RUN = "train_rm.py"  # the command that writes a run's files, in the folder's record
REPORT_FILES = (
    "eval.json",
    "reward_hist.png",
    "reward_length.png",
    "reliability.png",
)  # report.py's
RUN_FILES = ("ckpt.pt", "log.jsonl", "curves.png", *REPORT_FILES, "calibrated")
NUMBERED = re.compile(r"ckpt-(\d+)\.pt")  # --save_interval's checkpoints


def run_outputs(cfg):
    """The files a run writes in its --out_dir: RUN_FILES, and the numbered checkpoints of
    --save_interval already there that it would write again (each new one is added to the
    record before it is written: recorded)."""
    names = list(RUN_FILES)
    if cfg.save_interval and os.path.isdir(cfg.out_dir):
        for name in sorted(os.listdir(cfg.out_dir)):
            m = NUMBERED.fullmatch(name)
            names += [name] if m and int(m[1]) % cfg.save_interval == 0 else []
    return Outputs(cfg.out_dir, RUN, names, "--out_dir", earlier=earlier_run)


def earlier_run(folder):
    """Whether a folder without a record is a run of an older nanoRM (which kept none): its
    ckpt.pt is a training checkpoint of train_rm.py, torch.save's zip archive whose pickle holds
    the keys of one (read as bytes, nothing unpickled). Then its RUN_FILES are the run's."""
    try:
        with zipfile.ZipFile(os.path.join(folder, "ckpt.pt")) as z:
            (pickle,) = (n for n in z.namelist() if n.endswith("/data.pkl"))
            held = z.read(pickle)
    except (OSError, ValueError, zipfile.BadZipFile):
        return False
    return all(key in held for key in (b"kind", b"model", b"train_config", b"optimizer"))


@contextmanager
def claimed(cfg, proc):
    """The run's --out_dir for as long as the block runs: check_out_dir on every rank; on rank
    0, the lock (claim), the run's files checked again and added to the folder's record before
    any is written, and both given back at the end (release)."""
    check_out_dir(cfg, proc)
    lock = claim(cfg.out_dir) if proc.master else None
    try:
        if proc.master:
            run_outputs(cfg).claim()
        yield
    finally:
        release(lock)


def recorded(path):
    """path, once its name is in its folder's record as a run's file (a numbered checkpoint),
    refused in one line if it is a file nanoRM did not write; a folder without a record (the
    trainer used as a library) is left as it is."""
    folder, name = os.path.split(path)
    if os.path.lexists(os.path.join(folder, MARKER)):
        Outputs(folder, RUN, [name], "--out_dir").claim()
    return path


def check_out_dir(cfg, proc):
    """Never write over a file nanoRM did not write (run_outputs), nor replace another run by
    accident, nor resume nothing. Rank 0 looks before any rank writes, and every rank gets its
    answer, so that all of them stop together."""
    ckpt, problem = os.path.join(cfg.out_dir, "ckpt.pt"), None
    if proc.master:
        try:
            unknown = not os.path.lexists(os.path.join(cfg.out_dir, MARKER))
            if cfg.resume and unknown and os.path.isfile(ckpt) and not earlier_run(cfg.out_dir):
                load(ckpt)  # no run's checkpoint: a damaged one is named so by its reader
            run_outputs(cfg).check()
            if cfg.resume and not os.path.exists(ckpt):
                raise UsageError(
                    f"{ckpt} not found: nothing to resume (drop --resume to start a new run)"
                )
            if os.path.exists(ckpt) and not (cfg.resume or cfg.overwrite):
                raise UsageError(
                    f"{cfg.out_dir} holds a run ({ckpt}): pass --resume to continue it, "
                    "--overwrite to replace it, or another --out_dir"
                )
        except UsageError as e:
            problem = str(e)
    if proc.ddp:
        box = [problem]
        dist.broadcast_object_list(box, src=0)
        problem = box[0]
    if problem:
        raise UsageError(problem)


def claim(out_dir, fix="wait for it to end, or choose another --out_dir"):
    """A run owns its --out_dir while it runs: it holds an exclusive lock (flock) on
    out_dir/.lock, whose text names its process, and a second run into the folder is refused in
    one line naming the first, and what to do (fix). The kernel drops the lock when the process
    ends, however it ends, so a killed run's lock is free for the next one, and nothing is
    decided from the file's text (a process id may be reused; a full disk leaves it empty).
    Every writer into a run's folder takes it (eval_rm.py --save_calibration too). -> the lock,
    for release."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(f"--out_dir {out_dir} is a file: give a folder for the run")
    made = not os.path.exists(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, ".lock")
    while True:
        try:  # never through a link; a FIFO must not block the open
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as e:
            if disk_error(e):  # a read-only disk: said as such by run
                raise
            raise UsageError(f"{path} is not a lock file ({e.strerror}): remove it") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise UsageError(f"{path} is not a lock file (not a regular file): remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, _, host = os.pread(fd, 200, 0).decode(errors="replace").strip().partition(" ")
            os.close(fd)
            raise UsageError(
                f"{out_dir} is in use by another run (process {pid or '?'} on {host or '?'}): {fix}"
            ) from None
        try:  # the file a finishing run has just removed is no lock: open the new one
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:  # who holds it, for the message of a refused run (the lock itself is the flock)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    except OSError:
        pass
    return fd, path, made


def release(lock):
    """Give back the lock claim() took (None: nothing to do). A record of files none of which
    is there (a run refused before it wrote) goes, and the folder too if this run made it, so a
    refused run leaves no trace."""
    if lock is None:
        return
    fd, path, made = lock
    os.remove(path)  # removed while held: a run waiting on this file sees it is gone
    os.close(fd)
    out_dir = os.path.dirname(path)
    if os.listdir(out_dir) == [MARKER]:
        os.remove(os.path.join(out_dir, MARKER))
    if made and not os.listdir(out_dir):
        os.rmdir(out_dir)


# ----------------------------------------------------------------------------- the log
def start_log(path, keep_until=None):
    """Keep the log rows of the steps a resumed checkpoint holds (up to keep_until); a new
    run (keep_until None) starts an empty log. Makes the log's folder. A step below 0 is no
    step a run saved: refused, the log kept whole (not cut to nothing)."""
    if keep_until is not None and keep_until < 0:
        raise UsageError(
            f"--resume at step {keep_until}: a run's step is never negative, so its checkpoint "
            f"is damaged; {path} is kept as it is: --overwrite to start afresh"
        )
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if not os.path.exists(path):
        return
    with open(path) as f:
        lines = f.read().splitlines(keepends=True) if keep_until is not None else []
    rows = []
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a kill while it was written: dropped
            print(f"note: {path}:{i + 1} is torn (the run was stopped while writing it): dropped")
            continue
        if row["step"] <= keep_until:
            rows.append(line if line.endswith("\n") else line + "\n")
    with atomic_write(path, "w") as f:
        f.writelines(rows)


def append_row(path, row):
    append_text(path, json.dumps(row) + "\n")  # never through a link


MODEL_TERMS = ("lm_loss", "rho_quality", "rho_length", "gate_loss", "gate_acc")


def micro_metrics(out):
    """What a training row logs of one micro-step, as 0-d tensors left on the device: the
    objective, the pairwise loss, accuracy, the mean rewards, their margin, the model's terms."""
    r_c, r_r = out["r_chosen"].float(), out["r_rejected"].float()
    metrics = dict(objective=out["objective"].detach().float(), loss=out["rm_loss"].float())
    metrics.update(acc=accuracy(r_c, r_r), margin=(r_c - r_r).mean())
    metrics.update(reward_chosen=r_c.mean(), reward_rejected=r_r.mean())
    metrics.update({k: out[k].float() for k in MODEL_TERMS if k in out})
    return metrics


class TrainingLog:
    """Where a run's metrics go: log.jsonl (rank 0, when there is a save_dir), TensorBoard and
    W&B where they are on, and the printed lines. A training row is the mean of the metrics of
    the steps since the last row (a mean over the interval, not one noisy batch)."""

    def __init__(self, path, loggers, say, total_steps):
        self.path, self.loggers, self.say, self.total_steps = path, loggers, say, total_steps
        if path:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.sums, self.n, self.lr = {}, 0, None

    def add(self, metrics, lr):
        """One optimizer step's metrics (averaged over its micro-steps and the ranks)."""
        for k, v in metrics.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        self.n, self.lr = self.n + 1, lr

    def train_row(self, step, speed):
        """The training row of the steps added since the last one, if any; speed: the speed
        meter's (tokens/s, its line)."""
        if self.n == 0:
            return
        row = dict(step=step, split="train", lr=self.lr, steps=self.n)
        row.update({k: v / self.n for k, v in self.sums.items()})
        row["tok_per_s"], line = speed
        self.write(row)
        lm = f" | lm {row['lm_loss']:.4f}" if "lm_loss" in row else ""
        lm += f" | gate acc {row['gate_acc']:.3f}" if "gate_acc" in row else ""
        self.say(
            f"step {step}/{self.total_steps} | mean of {self.n} steps: loss {row['loss']:.4f} | "
            f"acc {row['acc']:.3f}{lm} | margin {row['margin']:.3f} | lr {self.lr:.2e} | {line}"
        )
        self.sums, self.n = {}, 0

    def eval_row(self, step, metrics, shown=("loss", "acc", "margin")):
        self.write(dict(step=step, split="eval", **metrics))
        self.say(f"step {step}: eval " + ", ".join(f"{k} {metrics[k]:.4f}" for k in shown))

    def write(self, row):
        if self.path:
            append_row(self.path, row)
        for logger in self.loggers:
            logger.log(row)

    def close(self):
        for logger in self.loggers:
            logger.close()


class Logger:
    """TensorBoard (torch.utils.tensorboard, needs the tensorboard package) or Weights & Biases
    (wandb): each row of log.jsonl as scalars named split/key, at its step."""

    def __init__(self, kind, log_dir, config):
        self.kind = kind
        if kind == "tensorboard":
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise UsageError(
                    "--log_dir writes TensorBoard events: pip install tensorboard"
                ) from None
            self.writer = SummaryWriter(log_dir)
        else:
            try:
                import wandb
            except ImportError:
                raise UsageError("--wandb logs to Weights & Biases: pip install wandb") from None
            self.run = wandb.init(project="nanorm", dir=log_dir, config=config)

    def log(self, row):
        scalars = {
            f"{row['split']}/{k}": v
            for k, v in row.items()
            if k not in ("step", "split") and isinstance(v, (int, float))
        }
        if self.kind == "tensorboard":
            for k, v in scalars.items():
                self.writer.add_scalar(k, v, row["step"])
        else:
            self.run.log(scalars, step=row["step"])

    def close(self):
        if self.kind == "tensorboard":
            self.writer.close()
        else:
            self.run.finish()


def open_loggers(log_dir, use_wandb, train_config, master):
    """The loggers written beside log.jsonl, on rank 0."""
    if not master:
        return []
    config = asdict(train_config) if is_dataclass(train_config) else train_config
    loggers = [Logger("tensorboard", log_dir, config)] if log_dir else []
    if use_wandb:
        loggers.append(Logger("wandb", log_dir, config))
    return loggers


def write_eval_text(path, metrics):
    """ColossalChat's evaluation file (save_dir/eval_result_epoch<N>.txt): the held-out loss,
    the mean rewards and their distance, one per line, and the accuracy."""
    lines = ["Evaluation Result:"] + [
        f"{name}: {metrics[key]}"
        for name, key in (
            ("loss", "loss"),
            ("chosen_rewards", "chosen"),
            ("rejected_rewards", "rejected"),
            ("distance", "margin"),
            ("accuracy", "acc"),
        )
    ]
    with atomic_write(path, "w") as f:
        f.write("\n".join(lines) + "\n")


# ----------------------------------------------------------------------------- pictures
def plot_log(out_dir):
    """curves.png: over the steps of log.jsonl, the pairwise loss, accuracy and margin (training
    rows are means over each log interval, evaluation rows the held-out pairs), and the LM term
    when the model has one (eval_rm draws the rest). matplotlib's object API: no pyplot and no
    backend switch, so a notebook that calls main() keeps showing its own figures."""
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    keys = ["loss", "acc", "margin"] + (["lm_loss"] if any("lm_loss" in r for r in rows) else [])
    fig = Figure(figsize=(3.4 * len(keys), 3.5))
    for ax, key in zip(fig.subplots(1, len(keys)), keys, strict=True):
        for split, style, label in (
            ("train", "-", "train (interval mean)"),
            ("eval", "o-", "eval"),
        ):
            pts = [(r["step"], r[key]) for r in rows if r["split"] == split and key in r]
            if pts:
                ax.plot(*zip(*pts, strict=True), style, label=label, alpha=0.8)
        ax.set_xlabel("step"), ax.set_title(key), ax.legend(), ax.grid(alpha=0.3)
    save_figure(fig, os.path.join(out_dir, "curves.png"))


def save_figure(fig, path, left=0.75, right=0.2, top=0.4, bottom=0.55, gap=0.8):
    """Every figure nanoRM draws (train_rm's curves, eval_rm's report, rl's and prm's curves):
    its grid of axes placed with fixed margins, in inches (room for tick labels, an axis label,
    a title), then written at 100 dpi, atomically. Fixed, not tight_layout: measuring every
    text to place the axes took 40% of the plotting, and plotting most of a short run."""
    w, h = fig.get_size_inches()
    rows, cols = fig.axes[0].get_subplotspec().get_gridspec().get_geometry()
    width = (w - left - right - (cols - 1) * gap) / cols  # of one axes
    height = (h - top - bottom - (rows - 1) * gap) / rows
    fig.subplots_adjust(left=left / w, right=1 - right / w, bottom=bottom / h, top=1 - top / h,
                        wspace=gap / width, hspace=gap / height)  # fmt: skip
    with atomic_write(path) as f:
        fig.savefig(f, dpi=100, format="png")
