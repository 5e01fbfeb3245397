package host

// NewestProcessStart is newestProcessStart (tests only).
var NewestProcessStart = newestProcessStart
