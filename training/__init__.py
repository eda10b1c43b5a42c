"""Training: SFT cold start and difficulty-aware multi-task RL (DGRPO) over agent trajectories."""
