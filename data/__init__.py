"""
Reading and writing the data of a reward model: preference rows (rows.py), their chat layout
(chat.py), tokenizers (tokenizer.py, bpe.py), prepared datasets and batches (pairs.py), and the
scripts that prepare them (prepare.py, arith/, hh_rlhf/). A mistake in the data is a
`nanorm.base.command.UsageError`: one line naming the file and the fix, exit 2.
"""
