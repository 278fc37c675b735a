from genhook.cli import main

main()
