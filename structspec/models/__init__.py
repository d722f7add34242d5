"""Model profiles, loading, and the forward-step executors the engine drives."""
