"""OpenAI / SGLang shaping: chat, completions, native, inspect (see DESIGN.md)."""
