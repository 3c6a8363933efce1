"""Generated text: backends (a local causal LM, an OpenAI-compatible endpoint, a user's file) that answer
``Generation`` requests (``biasflow.interface.requests``) through the one answer cache (``biasflow.scoring.answer``)."""
from biasflow.generation.answer import (ResponsesFileBackend, answer_generation, check_failures,
                                        read_responses_file)
from biasflow.generation.backends import GenerationSettings, HFGenerateBackend, OpenAIChatBackend, RateLimiter

__all__ = ["GenerationSettings", "HFGenerateBackend", "OpenAIChatBackend", "RateLimiter", "ResponsesFileBackend",
           "answer_generation", "check_failures", "read_responses_file"]
