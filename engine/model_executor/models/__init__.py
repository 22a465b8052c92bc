"""Model definitions; look classes up by HF architecture name."""
from engine.model_executor.models.registry import get_model_class, resolve_architecture, supported_architectures

__all__ = ["get_model_class", "resolve_architecture", "supported_architectures"]
