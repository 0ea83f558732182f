package shadow

// ReadNATSWait is readNATS: ReadNATS with a fetch wait of the test's choice.
var ReadNATSWait = readNATS
