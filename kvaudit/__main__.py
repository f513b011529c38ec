from kvaudit.cli import main

main()
