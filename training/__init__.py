"""Training platform: strict config (config.py), the one loop (loop.py: ``train(cfg) -> summary``),
checkpoints (checkpoint.py), distributed helpers, EMA, LR schedule, W&B/tqdm logging, summary.json, the
README demo (demo.py) and a toy on-disk task for tests (toy_data.py). See docs/training.md."""
