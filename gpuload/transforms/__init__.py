"""Transforms that run on the device, inside the model."""
