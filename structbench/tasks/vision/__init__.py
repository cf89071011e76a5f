"""Vision: image-classification models and the training task on real on-disk datasets."""
