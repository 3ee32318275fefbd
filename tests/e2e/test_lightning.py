"""Lightning's manual optimization drives a game: ``trainer.global_step`` counts game
steps and Lightning's checkpoints carry the game's state (resume bit for bit)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import gameopt

pl = pytest.importorskip("lightning.pytorch")


class GANModule(pl.LightningModule):
    """The recipe in the README: the game is built in ``__init__``, Lightning holds
    its optimizer, each training step is one game step."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        torch.manual_seed(0)
        self.gen = nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 2)).double()
        self.disc = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1)).double()
        self.game = gameopt.Game(
            [self.gen, self.disc], self.losses, algorithm=gameopt.Extragradient(0.05, update=gameopt.Adam((0.5, 0.9)))
        )

    def losses(self, x, z):
        real, fake = self.disc(x), self.disc(self.gen(z))
        d_loss = nn.functional.softplus(-real).mean() + nn.functional.softplus(fake).mean()
        g_loss = nn.functional.softplus(-fake).mean()
        return g_loss, d_loss, {"D(x)": torch.sigmoid(real).mean()}

    def configure_optimizers(self):
        return self.game.optimizer

    def training_step(self, batch, batch_idx):
        x, z = batch
        out = self.optimizers().step(closure=lambda: self.losses(x, z))
        self.log("d_loss", out[1])


def _data():
    g = torch.Generator().manual_seed(1)
    x, z = torch.randn(64, 2, generator=g, dtype=torch.float64), torch.randn(64, 2, generator=g, dtype=torch.float64)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, z), batch_size=16)  # 4 steps an epoch


def _fit(tmp_path, steps, ckpt_path=None):
    model = GANModule()
    with warnings.catch_warnings():
        # Lightning's advice (num_workers, "GPU available but not used" on a CUDA machine, ...)
        # is not under test here
        warnings.simplefilter("ignore")
        trainer = pl.Trainer(
            max_steps=steps,
            accelerator="cpu",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
            callbacks=[pl.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=1)],
        )
        trainer.fit(model, _data(), ckpt_path=ckpt_path)
    return model, trainer


def test_lightning_counts_game_steps_and_its_checkpoints_resume_the_game_bit_for_bit(tmp_path) -> None:
    straight, trainer = _fit(tmp_path / "straight", 8)
    assert trainer.global_step == 8
    assert straight.game.algorithm_state["rule"]["t"] == 16  # Extra-Adam: two rule updates per step
    # stopped at an epoch's end (Lightning restarts an interrupted epoch's data from its start)
    first, trainer = _fit(tmp_path / "killed", 4)
    assert trainer.global_step == 4
    resumed, trainer = _fit(tmp_path / "killed", 8, ckpt_path=str(tmp_path / "killed" / "last.ckpt"))
    assert trainer.global_step == 8
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)
    sa, sb = straight.game.state_dict()["algorithm"]["state"], resumed.game.state_dict()["algorithm"]["state"]
    assert sa["rule"]["t"] == sb["rule"]["t"]
    assert all(torch.equal(a, b) for a, b in zip(sa["rule"]["m"] + sa["rule"]["v"], sb["rule"]["m"] + sb["rule"]["v"]))
