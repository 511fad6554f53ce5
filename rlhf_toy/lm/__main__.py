from .pipeline.cli import console_main

console_main()
