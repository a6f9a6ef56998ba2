"""Training platform: strict config (config.py), the one loop (loop.py: ``train(cfg) -> summary``),
checkpoints (checkpoint.py), distributed helpers, EMA, LR schedule, W&B/tqdm logging, summary.json and the
README demo (demo.py). See docs/training.md."""
