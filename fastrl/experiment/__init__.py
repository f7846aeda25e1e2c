"""The experiment: its folder, a run's statistics and reports (TensorBoard, ``summary.json``,
progress lines), checkpoints, evaluation, videos and the bottleneck report."""
