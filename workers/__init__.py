"""The compute side: the MLP, its measurements, datasets, training, and the Ray Tune runner."""
