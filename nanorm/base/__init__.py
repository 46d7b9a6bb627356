"""
The ground floor: what the concept files at the top stand on. Nothing here imports a file above
it (the concept files, data/, the rest of nanorm/ or the scripts), except model.py's Transformer,
which checkpoints.py builds from a file.

    errors.py        an expected failure: UsageError, one line and exit 2 (run)
    files.py         writing a file aside and renaming it whole (atomic_write)
    cli.py           options as a dataclass, checked (parse_config); devices
    runtime.py       who this process is: processes under torchrun, device, dtype, speed
    checkpoints.py   every checkpoint read (llama2.c .bin/.pt, Meta, HF, ColossalChat, .gguf,
                     ours) into a Transformer and named tensors: load, load_transformer
    gguf_reader.py   llama.cpp's GGUF format: metadata, tensors, dequantization
    algebra/         the exact algebra verifiable.py compares answers with: verifiable.py's alone
"""
