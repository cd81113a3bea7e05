"""A Lightning script: a tiny language model on random tokens, DDP on CPU, validation and
checkpoints that take ``--save-s``. ``--callback`` adds rankguard's callback itself;
without it, ``rankguard run`` adds it through Lightning's entry point."""

import argparse
import time

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--save-s", type=float, default=0.0)
parser.add_argument("--step-s", type=float, default=0.05)  # compute time per micro-batch
parser.add_argument("--callback", action="store_true")
args = parser.parse_args()

SEQ, VOCAB = 16, 64


class TinyLM(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 32)
        self.head = torch.nn.Linear(32, VOCAB)

    def _loss(self, batch):
        logits = self.head(self.emb(batch))
        return torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), batch.view(-1))

    def training_step(self, batch, batch_idx):
        time.sleep(args.step_s)  # a real model's compute: the perf monitor sees the steps
        return self._loss(batch)

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._loss(batch), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class SlowIO(TorchCheckpointIO):
    def save_checkpoint(self, *a, **kw):
        time.sleep(args.save_s)  # a large model's checkpoint
        super().save_checkpoint(*a, **kw)


def loader(n):
    data = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(0))
    return torch.utils.data.DataLoader(data, batch_size=4)


callbacks = [ModelCheckpoint(dirpath=f"{args.out}/ckpt", every_n_train_steps=8)]
if args.callback:
    from rankguard.integrations.lightning import RankguardCallback

    callbacks.append(RankguardCallback())
trainer = pl.Trainer(
    max_steps=args.steps,
    accumulate_grad_batches=2,
    val_check_interval=12,
    limit_val_batches=2,
    num_sanity_val_steps=0,
    accelerator="cpu",
    devices=2,
    strategy="ddp",
    callbacks=callbacks,
    plugins=[SlowIO()],
    logger=CSVLogger(args.out, name="logs"),
    log_every_n_steps=1,
    enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(TinyLM(), loader(512), loader(16))
if trainer.is_global_zero:
    names = [type(cb).__name__ for cb in trainer.callbacks]
    print(f"lightning_callback done: callbacks {names}", flush=True)
