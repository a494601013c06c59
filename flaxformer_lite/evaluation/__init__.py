"""Evaluation of a trained model at many lengths."""
