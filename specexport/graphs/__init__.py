"""The step graphs as torch modules (export only): the Llama-family decoder with explicit KV in and out. The runtime never imports them."""
