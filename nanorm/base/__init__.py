"""
The ground floor: what the concept files at the top stand on. Nothing here imports a file above
it (the concept files, data/, the rest of nanorm/ or the scripts), except model.py's Transformer,
which checkpoints.py builds from a file.

    command.py       what every command shares: options as a dataclass, checked
                     (parse_config); a mistake as one line and exit 2 (UsageError, run);
                     the files a command owns (the .nanorm record), written aside
                     and renamed whole, never through a link (atomic_write)
    compat.py        where ColossalChat's and LLMBook's conventions meet nanoRM's
    runtime.py       who this process is: processes under torchrun, device, dtype, speed
    checkpoints.py   every checkpoint read (llama2.c .bin/.pt, Meta, HF, ColossalChat, .gguf,
                     ours) into a Transformer and named tensors: load, load_transformer
    gguf_reader.py   llama.cpp's GGUF format: metadata, tensors, dequantization
    algebra/         the exact algebra verifiable.py compares answers with: verifiable.py's alone
"""
