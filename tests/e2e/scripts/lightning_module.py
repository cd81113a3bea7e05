"""A PyTorch Lightning script, unmodified for rankguard (it never imports it).

A tiny regression module with a validation loop and a ``ModelCheckpoint`` callback, on
CPU with DDP (gloo). The validation data loader is slow (``--eval-sleep`` per
validation: a remote dataset), and the module stores extra state in every checkpoint
(``--save-sleep``: e.g. a tokenizer snapshot written alongside).
"""

import argparse
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, Dataset, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--default-root-dir", required=True)
parser.add_argument("--max-steps", type=int, default=12)
parser.add_argument("--val-every", type=int, default=6)
parser.add_argument("--eval-sleep", type=float, default=0.0)
parser.add_argument("--save-sleep", type=float, default=0.0)
args = parser.parse_args()


class SlowValidationSet(Dataset):
    def __init__(self, n: int = 8) -> None:
        self.x = torch.randn(n, 8)
        self.y = torch.randn(n, 1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        time.sleep(args.eval_sleep / len(self.x))
        return self.x[i], self.y[i]


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def on_save_checkpoint(self, checkpoint):
        time.sleep(args.save_sleep)
        checkpoint["extra"] = {"saved_at": time.time()}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


train = DataLoader(TensorDataset(torch.randn(512, 8), torch.randn(512, 1)), batch_size=8)
val = DataLoader(SlowValidationSet(), batch_size=8)
trainer = L.Trainer(
    accelerator="cpu",
    devices=2,
    strategy="ddp",
    max_steps=args.max_steps,
    val_check_interval=args.val_every,
    num_sanity_val_steps=0,
    limit_val_batches=1,
    callbacks=[ModelCheckpoint(every_n_train_steps=args.val_every, save_top_k=-1)],
    default_root_dir=args.default_root_dir,
    logger=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(Regressor(), train, val)
if trainer.is_global_zero:
    print(f"lightning_module done: {trainer.global_step} steps", flush=True)
