"""A small CNN on scikit-learn's bundled digits as 1x8x8 tensors: two generations logged with
``mlflow.pytorch.log_model`` and a tensor signature, and the evaluation set as Parquet (an array
column) and as ``.npz`` (the tensor path, with real components)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from registry_fixtures import sqlite_uri
from torch import nn

MODEL = "digits-cnn"
CLASSES = [str(d) for d in range(10)]


class DigitsNet(nn.Module):
    """conv 3x3 -> ReLU -> max-pool -> linear: logits for the ten digits of a (batch, 1, 8, 8) input."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.1), nn.Linear(channels * 16, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def digits_split(n_train: int = 1000) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Train and evaluation images (n, 1, 8, 8) in [0, 1] with their digit labels, shuffled with a fixed seed."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.target))
    x = (digits.images[order] / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target[order].astype(np.int64)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def train(x: np.ndarray, y: np.ndarray, seed: int, epochs: int) -> DigitsNet:
    """One plain training run with Adam (the user's own recipe, as a team would write it)."""
    torch.manual_seed(seed)
    net = DigitsNet()
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    for _ in range(epochs):
        net.train()
        for batch in torch.randperm(len(xt)).split(64):
            optimizer.zero_grad()
            nn.functional.cross_entropy(net(xt[batch]), yt[batch]).backward()
            optimizer.step()
    return net.eval()


def build_tensor_store(root: Path) -> dict:
    """A SQLite store with ``digits-cnn`` v1 (@champion) and v2 (a retrain that flips samples), both
    logged with a (-1, 1, 8, 8) float32 signature; the evaluation set as Parquet with a 64-value array
    column ``pixels`` and as ``eval.npz`` (x, y, ids). Returns the URI and the paths."""
    import mlflow
    from mlflow import MlflowClient
    from mlflow.models import infer_signature

    uri = sqlite_uri(root)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    mlflow.set_experiment("training")  # in this store (an earlier test may have left another one active)
    x_train, y_train, x_eval, y_eval = digits_split()
    client = MlflowClient(uri)
    for version, (seed, epochs, n) in enumerate([(0, 12, 1000), (1, 3, 400)], start=1):
        net = train(x_train[:n], y_train[:n], seed, epochs)
        signature = infer_signature(x_eval[:2], net(torch.as_tensor(x_eval[:2])).detach().numpy())
        with mlflow.start_run(run_name=f"digits generation {version}"):
            mlflow.pytorch.log_model(
                net,
                name="model",
                registered_model_name=MODEL,
                signature=signature,
                input_example=x_eval[:2],
                pip_requirements=["torch"],
            )
        client.set_model_version_tag(MODEL, str(version), "consistency_gate.classes", json.dumps(CLASSES))
    client.set_registered_model_alias(MODEL, "champion", "1")
    ids = np.array([f"d{i}" for i in range(len(y_eval))])
    pixels = list(x_eval.reshape(len(x_eval), -1))
    pd.DataFrame({"id": ids, "pixels": pixels, "label": y_eval}).to_parquet(root / "eval.parquet", index=False)
    np.savez(root / "eval.npz", x=x_eval, y=y_eval, ids=ids)
    np.savez(root / "train.npz", x=x_train, y=y_train)
    return {"uri": uri, "parquet": root / "eval.parquet", "npz": root / "eval.npz", "train": root / "train.npz"}
