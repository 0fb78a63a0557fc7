"""The benchmark (`python -m bench`): what watching costs over running the model bare, as ratios."""
