"""The model catalog: which public model ids exist, what they cost, where they run."""
