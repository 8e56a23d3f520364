"""A prelude for `python -c`: torch cannot be imported after it (tests of the torch-free paths)."""

BLOCK_TORCH = ("import sys\n"
               "class Block:\n"
               "    def find_spec(self, name, path=None, target=None):\n"
               "        if name == 'torch' or name.startswith('torch.'):\n"
               "            raise ImportError('torch is blocked')\n"
               "sys.meta_path.insert(0, Block())\n")
