from consistency_gate.cli import main

main()
