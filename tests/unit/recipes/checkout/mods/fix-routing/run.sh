#!/bin/bash
echo fix-routing
