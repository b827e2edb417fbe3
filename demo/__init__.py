"""The offline demo: a generated captioned gallery, the training script of the shipped model, `cnclip demo`."""
