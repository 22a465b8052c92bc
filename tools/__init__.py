"""Build-time tools (the built-in tokenizer and its corpus); not installed with the package."""
