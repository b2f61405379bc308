from relsearch.cli import main

main()
