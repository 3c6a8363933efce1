"""The model kinds' declarations: each module declares a family of kinds (``model_kinds.register_model_kind``) with
the config model each kind's model configs are validated by (a ``schema.ModelOptions`` subclass).

``biasflow.model_kinds`` imports every module here on the first read of its registry, so a kind declared in a new
module is known to the plan and to every score job without an edit elsewhere. These modules import neither torch
nor transformers: planning stays light (adapters and answerers are named as ``"module:function"`` strings).
"""
