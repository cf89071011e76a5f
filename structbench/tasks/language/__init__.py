"""Language modelling: decoder models and the next-token training task on real corpora."""
