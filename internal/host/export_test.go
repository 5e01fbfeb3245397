package host

// SetAfterResolve makes f call hook between resolving a path and acting on it (tests only).
func SetAfterResolve(f *FS, hook func(hostPath string)) { f.afterResolve = hook }

// NewestProcessStart is newestProcessStart (tests only).
var NewestProcessStart = newestProcessStart
