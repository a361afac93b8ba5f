"""The course's tiny model: a Llama-architecture decoder, its tokenizer, corpus and training entry point."""
