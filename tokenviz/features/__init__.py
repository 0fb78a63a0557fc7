"""Sparse autoencoders on the residual stream: read from the folders their libraries write, and their
encode, as those libraries compute it."""
