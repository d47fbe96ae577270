from pipeline.collect.cli import main

main()
