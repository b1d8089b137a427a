"""`dcoco bench`: the paper's serving benchmark against any OpenAI-compatible server (client), and its tables and
plots (report)."""
