from kvaudit.main import main

main()
